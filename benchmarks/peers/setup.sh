#!/usr/bin/env bash
# Start Redis and PostgreSQL on loopback in a throwaway directory, and make a venv
# with the peer libraries (arq, saq, taskiq, dramatiq, procrastinate). Run as root.
#
#   bash benchmarks/peers/setup.sh        # then: python benchmarks/peers/run.py
#   bash benchmarks/peers/teardown.sh     # stops both servers (the venv is kept)
#
# Everything lives under $PEERS_DIR (default /tmp/trioq-peers): redis/, pg/, venv/ and
# env.sh, which run.py reads (REDIS_URL, PG_DSN, PEERS_PYTHON). The peers are never
# installed into trioq's own environment.
set -euo pipefail

PEERS_DIR=${PEERS_DIR:-/tmp/trioq-peers}
REDIS_PORT=${REDIS_PORT:-6390}
PG_PORT=${PG_PORT:-5439}
PGBIN=/usr/lib/postgresql/15/bin
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$PEERS_DIR"

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
[ -x "$PGBIN/initdb" ] || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} from Debian's packages" >&2
    apt-get update -qq
    # policy-rc.d: the packages must not start system-wide services of their own.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    rm -f /usr/sbin/policy-rc.d
fi

# Redis: in memory only, as the peers' own benchmarks run it.
mkdir -p "$PEERS_DIR/redis"
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
        --dir "$PEERS_DIR/redis" --pidfile "$PEERS_DIR/redis/redis.pid" --logfile "$PEERS_DIR/redis/redis.log"
    for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
redis-cli -p "$REDIS_PORT" ping >/dev/null

# PostgreSQL: a fresh cluster owned by the postgres user, defaults (fsync on).
PGDATA="$PEERS_DIR/pg"
if [ ! -f "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
    su postgres -s /bin/sh -c "$PGBIN/initdb -D '$PGDATA' -A trust -U postgres" >/dev/null
fi
if ! su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D '$PGDATA' status" >/dev/null 2>&1; then
    su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D '$PGDATA' -w -l '$PGDATA/server.log' \
        -o '-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PGDATA -c max_connections=300' start" >/dev/null
fi
psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='bench'" | grep -q 1 ||
    psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "CREATE DATABASE bench"

# The peers' venv: its own interpreter, so nothing reaches trioq's environment.
if [ ! -x "$PEERS_DIR/venv/bin/python" ]; then
    python3 -m venv "$PEERS_DIR/venv"
fi
"$PEERS_DIR/venv/bin/pip" install -q --upgrade pip >/dev/null
"$PEERS_DIR/venv/bin/pip" install -q -r "$HERE/requirements.txt"

cat > "$PEERS_DIR/env.sh" <<ENV
export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export PG_DSN=postgresql://postgres@127.0.0.1:$PG_PORT/bench
export PEERS_PYTHON=$PEERS_DIR/venv/bin/python
ENV
echo "peers ready: $(cat "$PEERS_DIR/env.sh" | tr '\n' ' ')" >&2

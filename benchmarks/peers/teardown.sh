#!/usr/bin/env bash
# Stop the Redis and PostgreSQL servers that setup.sh started (the venv and data stay).
set -uo pipefail
PEERS_DIR=${PEERS_DIR:-/tmp/trioq-peers}
REDIS_PORT=${REDIS_PORT:-6390}
redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
if [ -f "$PEERS_DIR/pg/PG_VERSION" ]; then
    su postgres -s /bin/sh -c "/usr/lib/postgresql/15/bin/pg_ctl -D '$PEERS_DIR/pg' -m fast -w stop" >/dev/null 2>&1 || true
fi
echo "peers stopped" >&2

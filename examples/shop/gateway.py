"""The fake payment gateway: strict about its limits, flaky on purpose, slow to settle PIX.

:class:`FakeGateway` is the provider itself. Its contract, as a real one
publishes it:

- **At most 4 requests at once**: one arriving while 4 are in flight is
  refused with HTTP 429 (:class:`RateLimited`, ``reason="concurrency"``).
- **20 requests per second, bursts of 5**: a token bucket (GCRA) with room
  for 5; a request that finds it empty is refused with 429
  (``reason="rate"``). The bucket allows ``allowance`` seconds (default
  50 ms) of network jitter between the moment a client sent and the moment
  the gateway saw a request, as providers do (a worker's first request
  opens its connection: tens of milliseconds that later requests do not
  pay, so that request arrives late and the next ones closer together);
  :meth:`FakeGateway.stats` also counts the requests that only
  the allowance let through (``strict_rate_violations``), so nothing hides
  behind it. Refused requests take no token.
- **15% of new charges fail** (HTTP 503, :class:`GatewayFailure`): nothing is
  charged, and the same request later may succeed. Which ones fail is a
  pure function of the seed, the idempotency key and the try, so every run
  and every store sees the same failures.
- **Idempotency keys**: a charge request with a key already used returns
  that charge; the card is never charged twice. ``succeeded_by_order``
  counts the charges that succeeded, per order id: exactly one each is the
  "exactly once" the shop promises; ``requests_by_order`` counts the tries.
- **PIX settles later**: a PIX charge is ``pending`` for ``pix_settle``
  seconds after it was created; asking again with its key (the payment job
  snoozes, then asks) returns ``succeeded`` once it has settled.

Requests take 10-40 ms (5% of them 150-300 ms), on the trio clock, so tests
on the autojump clock take no time. In one process, handlers call the
gateway directly (:class:`FakeGateway` has the client's ``charge`` method);
across processes (PostgreSQL's API and ``trioq worker`` processes) it is
served over HTTP on 127.0.0.1 (:func:`serve`; ``python -m shop.gateway``
runs it as a process of its own, :func:`main`) so that one instance counts
every process's requests, and workers reach it through :class:`HTTPGateway`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

__all__ = [
    "ChargeResult",
    "FakeGateway",
    "Gateway",
    "GatewayError",
    "GatewayFailure",
    "HTTPGateway",
    "RateLimited",
    "busiest_window",
    "main",
    "serve",
]


class GatewayError(Exception):
    """A charge request the gateway refused or failed; nothing was charged. ``status``: its HTTP status."""

    status = 500


class RateLimited(GatewayError):
    """HTTP 429: over the gateway's limits (``reason``: ``"rate"`` or ``"concurrency"``)."""

    status = 429

    def __init__(self, reason: str) -> None:
        super().__init__(f"429 Too Many Requests ({reason})")
        self.reason = reason


class GatewayFailure(GatewayError):
    """HTTP 503: the processor failed this charge; try again later."""

    status = 503


@attrs.frozen
class ChargeResult:
    """What a charge request returned: ``status`` is ``"succeeded"`` or ``"pending"`` (PIX, not settled yet)."""

    charge_id: str
    status: str
    amount: int


class Gateway(Protocol):
    """What the payment job needs: one charge call, idempotent by ``idempotency_key``."""

    async def charge(self, *, order_id: str, amount: int, method: str, idempotency_key: str) -> ChargeResult:
        """Charge ``amount`` for ``order_id``; raises :class:`GatewayError` (nothing charged)."""
        ...


@attrs.define
class _Charge:
    id: str
    order_id: str
    amount: int
    method: str
    status: str
    settles_at: float


@attrs.define
class _Request:
    at: float  # the gateway's clock
    order_id: str
    outcome: str  # "succeeded", "pending", "replay", "failed", "429-rate", "429-concurrency"


def busiest_window(times: list[float], window: float = 1.0) -> int:
    """The most of ``times`` inside any half-open window ``[t, t + window)``."""
    ordered = sorted(times)
    best = 0
    j = 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best


class FakeGateway:
    """The provider (see the module docstring); ``clock`` is trio's by default."""

    def __init__(
        self,
        *,
        max_in_flight: int = 4,
        rate: float = 20.0,
        burst: int = 5,
        allowance: float = 0.05,
        fail_rate: float = 0.15,
        pix_settle: float = 0.5,
        latency: tuple[float, float] = (0.010, 0.040),
        slow: tuple[float, float, float] = (0.05, 0.150, 0.300),
        seed: int = 0,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.interval = 1.0 / rate
        self.burst = burst
        self.allowance = allowance
        self.fail_rate = fail_rate
        self.pix_settle = pix_settle
        self.latency = latency
        self.slow = slow
        self.seed = seed
        self.clock = clock
        self.in_flight = 0
        self.max_seen_in_flight = 0
        self.requests: list[_Request] = []
        self.charges: dict[str, _Charge] = {}  # by idempotency key
        self.succeeded_by_order: Counter[str] = Counter()
        self.requests_by_order: Counter[str] = Counter()
        self.strict_rate_violations = 0
        self.worst_rate_excess = -math.inf  # seconds: the most any request came earlier than the strict bucket allows
        self._tat = -math.inf  # the bucket's theoretical arrival time
        self._tries: Counter[str] = Counter()  # tries to create a charge, per key

    def _admit(self, now: float) -> str | None:
        """Take a token and an in-flight slot, or say why not (``None``: admitted)."""
        if self.in_flight >= self.max_in_flight:
            return "concurrency"
        tat = max(self._tat, now)
        tolerance = (self.burst - 1) * self.interval
        excess = tat - now - tolerance  # how much earlier than the strict bucket allows (> 0: early)
        self.worst_rate_excess = max(self.worst_rate_excess, excess)
        if excess > self.allowance + 1e-9:
            return "rate"
        if excess > 1e-9:
            self.strict_rate_violations += 1
        self._tat = tat + self.interval
        return None

    def _draw(self, key: str, n: int, what: str) -> float:
        return random.Random(f"{self.seed}:{key}:{n}:{what}").random()

    async def charge(self, *, order_id: str, amount: int, method: str, idempotency_key: str) -> ChargeResult:
        """One charge request (the HTTP server's ``POST /charges`` calls this too)."""
        now = self.clock()
        self.requests_by_order[order_id] += 1
        refused = self._admit(now)
        if refused is not None:
            self.requests.append(_Request(now, order_id, f"429-{refused}"))
            raise RateLimited(refused)
        request = _Request(now, order_id, "in-flight")
        self.requests.append(request)
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        try:
            n = len(self.requests)
            low, high = self.latency
            seconds = low + (high - low) * self._draw(idempotency_key, n, "latency")
            share, slow_low, slow_high = self.slow
            if self._draw(idempotency_key, n, "slow") < share:
                seconds = slow_low + (slow_high - slow_low) * self._draw(idempotency_key, n, "slow-latency")
            await trio.sleep(seconds)
            existing = self.charges.get(idempotency_key)
            if existing is not None:
                if existing.status == "pending" and self.clock() >= existing.settles_at:
                    existing.status = "succeeded"
                    self.succeeded_by_order[existing.order_id] += 1
                request.outcome = "replay" if existing.status == "succeeded" else "pending"
                return ChargeResult(existing.id, existing.status, existing.amount)
            self._tries[idempotency_key] += 1
            if self._draw(idempotency_key, self._tries[idempotency_key], "fail") < self.fail_rate:
                request.outcome = "failed"
                raise GatewayFailure("503 processor unavailable: nothing was charged, try again")
            status = "pending" if method == "pix" else "succeeded"
            created = _Charge(f"ch_{len(self.charges) + 1:05d}", order_id, amount, method, status, 0.0)
            created.settles_at = self.clock() + self.pix_settle
            self.charges[idempotency_key] = created
            if status == "succeeded":
                self.succeeded_by_order[order_id] += 1
            request.outcome = status
            return ChargeResult(created.id, status, amount)
        finally:
            self.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        """What the gateway saw, JSON-ready (the benchmark's gateway figures come from here)."""
        outcomes = Counter(r.outcome for r in self.requests)
        return {
            "requests": len(self.requests),
            "busiest_second": busiest_window([r.at for r in self.requests]),
            "rejected_429": outcomes["429-rate"] + outcomes["429-concurrency"],
            "rejected_429_rate": outcomes["429-rate"],
            "rejected_429_concurrency": outcomes["429-concurrency"],
            "failed_503": outcomes["failed"],
            "pending_answers": outcomes["pending"],
            "replays": outcomes["replay"],
            "max_in_flight": self.max_seen_in_flight,
            "strict_rate_violations": self.strict_rate_violations,
            "worst_rate_excess_ms": round(self.worst_rate_excess * 1000, 1) if self.requests else None,
            "succeeded_by_order": dict(self.succeeded_by_order),
            "requests_by_order": dict(self.requests_by_order),
            "request_times": [r.at for r in self.requests],
        }


# ------------------------------------------------------------------- HTTP


def create_app(gateway: FakeGateway) -> Any:
    """A Quart-Trio app serving ``gateway``: ``POST /charges`` and ``GET /stats``."""
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio("fake-gateway")

    @app.post("/charges")
    async def charge() -> Any:
        body = await request.get_json()
        try:
            result = await gateway.charge(
                order_id=str(body["order_id"]),
                amount=int(body["amount"]),
                method=str(body["method"]),
                idempotency_key=str(body["idempotency_key"]),
            )
        except GatewayError as exc:
            return {"error": str(exc), "reason": getattr(exc, "reason", None)}, exc.status
        return attrs.asdict(result), 200

    @app.get("/stats")
    async def stats() -> Any:
        return gateway.stats()

    return app


async def serve(
    gateway: FakeGateway,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown: trio.Event,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``gateway`` until ``shutdown`` is set; ``nursery.start`` returns its base URL."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5
    config.keep_alive_timeout = 30.0
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(
            lambda task_status: hypercorn_serve(
                create_app(gateway),
                config,  # type: ignore[arg-type]
                shutdown_trigger=shutdown.wait,  # type: ignore[arg-type]
                task_status=task_status,
            )
        )
        task_status.started(bound[0] if isinstance(bound, list) else str(bound))


class HTTPGateway:
    """The gateway's client over HTTP (``trioq worker`` processes use it); the same ``charge`` as FakeGateway.

    The HTTP client is built here, not at the first charge: importing httpx and building its client
    (its TLS context) takes a few hundred milliseconds of the event loop, which a charge the limiter
    just let start must not spend before its request leaves.
    """

    def __init__(self, url: str, *, timeout: float = 5.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.timeout = timeout
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=self.timeout, limits=limits)

    async def charge(self, *, order_id: str, amount: int, method: str, idempotency_key: str) -> ChargeResult:
        """POST /charges; raises :class:`RateLimited` (429) or :class:`GatewayFailure` (5xx, or no answer)."""
        import httpx

        body = {"order_id": order_id, "amount": amount, "method": method, "idempotency_key": idempotency_key}
        try:
            response = await self._client.post("/charges", json=body)
        except httpx.TransportError as exc:
            raise GatewayFailure(f"gateway unreachable: {exc!r}") from exc
        if response.status_code == 429:
            raise RateLimited(str(response.json().get("reason")))
        if response.status_code != 200:
            raise GatewayFailure(f"{response.status_code}: {response.text[:200]}")
        data = response.json()
        return ChargeResult(str(data["charge_id"]), str(data["status"]), int(data["amount"]))


# ----------------------------------------------------------------- process


async def _serve_process(args: argparse.Namespace) -> None:
    import signal

    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    shutdown.set()
                    return

        nursery.start_soon(on_signal)
        gateway = FakeGateway(seed=args.seed, allowance=args.allowance)
        url = await nursery.start(lambda task_status: serve(gateway, host=args.host, port=args.port,
                                                            shutdown=shutdown, task_status=task_status))  # fmt: skip
        print(f"fake gateway serving on {url}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m shop.gateway [--port 0] [--seed 0] [--allowance 0.05]``: the fake gateway as a process of
    its own, until SIGTERM/SIGINT; prints ``fake gateway serving on URL``. ``GET /stats`` reports what it saw.

    Its own process, as a provider is its own machine: the time it stamps on a request is not held up by
    whatever else the process that starts it (a benchmark's driver, its clients) is doing.
    """
    parser = argparse.ArgumentParser(prog="python -m shop.gateway", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--allowance", type=float, default=0.05, help="seconds of jitter the rate bucket forgives (default 0.05)"
    )
    trio.run(_serve_process, parser.parse_args(argv))


if __name__ == "__main__":
    main()

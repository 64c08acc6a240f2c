"""trioq's routes inside your own Quart-Trio app, the queue living exactly as long as the app.

    TRIOQ_TOKEN=secret python examples/blueprint_app.py       # http://127.0.0.1:5000

    curl -s localhost:5000/thumbnails -d '{"image": "cat.png"}'            # your route
    curl -s -H "Authorization: Bearer secret" localhost:5000/queue/jobs/<id> # trioq's

The queue opens when the app starts serving and closes when it stops:

- ``before_serving`` starts the queue as a task in ``app.nursery``, quart-trio's
  nursery for the app's whole lifespan (where its background tasks run too), and
  mounts ``trioq.http.blueprint(queue)`` under ``/queue`` once the queue exists;
- ``after_serving`` tells that task to leave ``open_queue`` and waits until it has:
  running jobs get ``shutdown_grace`` seconds, the rest go back to ``ready``.

Waiting in ``after_serving`` matters: the server cancels the app's lifespan as
soon as shutdown returns, which would cut the grace period short. Keep
``shutdown_grace`` below the app's ``BACKGROUND_TASK_SHUTDOWN_TIMEOUT`` (5 s by
default), the deadline quart-trio puts on ``app.nursery`` at shutdown. (A
``while_serving`` generator would be shorter, but it would yield from inside
``open_queue``'s nursery, which trio forbids outside context managers.)
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import trio
from quart import request
from quart_trio import QuartTrio

import trioq
from trioq.http import blueprint

registry = trioq.Registry()


@registry.task(max_attempts=3)
async def thumbnail(ctx: trioq.JobContext, image: str, width: int = 128) -> dict[str, Any]:
    await trio.sleep(0.05)  # resize the image here
    return {"image": image, "thumbnail": f"{image.rsplit('.', 1)[0]}-{width}w.png"}


async def _run_queue(
    stop: trio.Event, closed: trio.Event, *, task_status: trio.TaskStatus[trioq.Queue] = trio.TASK_STATUS_IGNORED
) -> None:
    """Hold a queue open until ``stop`` is set; set ``closed`` once it has shut down."""
    try:
        async with trioq.open_queue(registry, workers=4, shutdown_grace=3.0) as queue:
            task_status.started(queue)
            await stop.wait()
    finally:
        closed.set()


def make_app(token: str) -> QuartTrio:
    """A Quart-Trio app of your own, with trioq's routes under ``/queue``."""
    app = QuartTrio(__name__)

    @app.post("/thumbnails")
    async def request_thumbnail() -> tuple[dict[str, Any], int]:
        body = await request.get_json(force=True)
        queue: trioq.Queue = app.extensions["trioq"]
        job = await queue.enqueue("thumbnail", {"image": body["image"]})
        return {"id": job.id, "poll": f"/queue/jobs/{job.id}"}, 202

    @app.before_serving
    async def open_queue() -> None:
        stop, closed = trio.Event(), trio.Event()
        queue = await app.nursery.start(_run_queue, stop, closed)
        app.extensions["trioq"], app.extensions["trioq.stop"] = queue, (stop, closed)
        app.register_blueprint(blueprint(queue, token=token), url_prefix="/queue")

    @app.after_serving
    async def close_queue() -> None:
        stop, closed = app.extensions.pop("trioq.stop")
        stop.set()
        await closed.wait()

    return app


TOKEN = os.environ.get("TRIOQ_TOKEN") or secrets.token_urlsafe(16)
app = make_app(TOKEN)

if __name__ == "__main__":
    if "TRIOQ_TOKEN" not in os.environ:
        print(f"TRIOQ_TOKEN is not set; /queue takes this one: {TOKEN}")
    app.run()  # for development; in production: hypercorn -k trio blueprint_app:app

"""The README's embedding example: a queue inside your own trio program."""

import trio

import trioq

registry = trioq.Registry()


@registry.task(max_attempts=3, backoff=trioq.Backoff(base=0.05), heartbeat_timeout=5.0)
async def resize(ctx: trioq.JobContext, image: str, width: int) -> dict[str, object]:
    if ctx.attempt == 1 and image.endswith("3.png"):
        raise ConnectionError("storage hiccup")  # retried with backoff
    await trio.sleep(0.01)  # real work goes here
    ctx.heartbeat()  # "still alive": pushes the hang deadline out
    return {"image": image, "width": width}


async def main() -> None:
    async with trioq.open_queue(registry, workers=4) as queue:
        jobs = [await queue.enqueue("resize", {"image": f"{n}.png", "width": 640}) for n in range(5)]
        for job in jobs:
            done = await queue.wait(job.id, timeout=10)
            print(done.state, done.attempts, done.result)


if __name__ == "__main__":
    trio.run(main)

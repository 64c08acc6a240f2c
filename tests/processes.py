"""Helpers for the tests that run trioq's commands as child processes."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time

__all__ = ["read_until"]


def read_until(
    process: subprocess.Popen[bytes], pattern: re.Pattern[str], timeout: float
) -> tuple[re.Match[str] | None, bytes]:
    """Read ``process``'s stdout (left non-blocking) until ``pattern`` matches what was read, for at most
    ``timeout`` seconds or until it closes; ``(the match or None, every byte read)``."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if selector.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buffer += chunk
                if match := pattern.search(buffer.decode(errors="replace")):
                    return match, buffer
    return None, buffer

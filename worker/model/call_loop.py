"""One asyncio event loop per process, in a daemon thread, for the process's model calls.

A Celery worker thread hands a coroutine to ``CallLoop.submit`` and returns at once; the loop runs
every call of the process concurrently (``worker.model.async_client``), and a call's completion is
reported through the returned ``concurrent.futures.Future``. Made lazily after fork (a prefork
child gets its own loop; a loop never crosses a fork).

The loop is uvloop's (libuv, in C): the loop's own work per call (scheduling callbacks, polling
sockets, reading aiohttp's responses) was about a tenth of a steps worker's CPU on asyncio's
pure-Python loop (a py-spy profile of ``bench/concurrency.py``; bench/README.md, "Cost of a turn").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, TypeVar

import uvloop

T = TypeVar("T")


class CallLoop:
    """An event loop running in its own daemon thread (``name``).

    - ``submit(coro)``: schedule a coroutine from any thread; a ``concurrent.futures.Future``;
    - ``call_soon(fn)``: run ``fn()`` on the loop from any thread;
    - ``loop``: the loop itself (``call_later`` from inside it);
    - ``stop(timeout)``: stop the loop and join its thread (seconds).
    """

    def __init__(self, name: str = "agent-model-calls"):
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    @property
    def running(self) -> bool:
        """True while the loop's thread runs."""
        return self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future (``cancel()`` cancels the coroutine)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on the loop's thread, soon."""
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop (calls in flight are abandoned) and wait up to ``timeout`` s for its thread."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

"""The prepare stages' worker pool: spawn processes started on first use, and their progress queue."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_progress_queue = None  # where report_progress puts amounts: the pool's queue in a worker, or a callback


def _init_worker(queue: Any) -> None:
    global _progress_queue
    _progress_queue = queue
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; parallelism is the pool


def report_progress(amount: int) -> None:
    """Report work done (characters) from a task, in a worker or in the main process."""
    if _progress_queue is not None:
        _progress_queue.put(amount)


class _CallbackQueue:
    def __init__(self, callback: Callable[[int], None]):
        self.put = callback


@contextmanager
def local_progress(callback: Callable[[int], None]) -> Iterator[None]:
    """While a task runs in this process, send its report_progress amounts to `callback`."""
    global _progress_queue
    _progress_queue = _CallbackQueue(callback)
    try:
        yield
    finally:
        _progress_queue = None


class Workers:
    """A lazily started spawn process pool (none at all with one worker), with a progress queue."""

    def __init__(self, count: int):
        self.count = count
        self.executor = None
        self.queue = None

    def start(self) -> None:
        if self.executor is None and self.count > 1:
            context = multiprocessing.get_context("spawn")
            self.queue = context.Queue()
            self.executor = ProcessPoolExecutor(self.count, mp_context=context, initializer=_init_worker,
                                                initargs=(self.queue,))

    def drain(self) -> int:
        """The progress the workers reported since the last drain."""
        total = 0
        if self.queue is not None:
            while True:
                try:
                    total += self.queue.get_nowait()
                except queue_module.Empty:
                    return total
        return total

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None

"""The prepare stages' worker pool: spawn processes started on first use, and their progress queue. Workers ignore
Ctrl-C (it reaches the terminal's whole process group): the main process handles it and stops them. SIGTERM (a
preemption) raises Terminated in the main process, which stops the workers the same way."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from bertrain.child_process import on_parent_death

_progress_queue = None  # where report_progress puts amounts: the pool's queue in a worker, or a callback


PARENT_CHECK_SECONDS = 1.0


def _init_worker(queue: Any, parent: int) -> None:
    global _progress_queue
    _progress_queue = queue
    # Ends once prepare is gone (`kill -9`): an orphan would go on writing shards beside the next run's workers.
    on_parent_death(parent, lambda: os._exit(1), PARENT_CHECK_SECONDS)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; parallelism is the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # then let it in: a Ctrl-C since the start is dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _started() -> None:
    """A task that does nothing: submitting one per worker starts them all."""


def report_progress(amount: int) -> None:
    """Report work done (characters) from a task, in a worker or in the main process."""
    if _progress_queue is not None:
        _progress_queue.put(amount)


class Terminated(KeyboardInterrupt):
    """SIGTERM in the main process: a KeyboardInterrupt, so that it unwinds wherever a Ctrl-C does (no
    `except Exception` swallows it), but one that asks to be requeued."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated; the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


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
                                                initargs=(self.queue, os.getpid()))
            # Each submit may start a worker; started now with SIGINT blocked, each inherits the block and keeps
            # it until _init_worker ignores SIGINT, so a Ctrl-C while a worker starts prints no traceback.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for _ in range(self.count):
                    self.executor.submit(_started)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

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

    def close(self, interrupted: bool = False) -> None:
        """Wait for the running tasks, or after a Ctrl-C (`interrupted`) end them: their outputs are written
        atomically, so a rerun redoes what they had begun."""
        if self.executor is not None:
            if interrupted:
                for process in multiprocessing.active_children():  # in prepare, only this pool's workers
                    process.terminate()
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None

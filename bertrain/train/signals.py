"""Stop signals (stdlib only: imported before torch). SIGTERM / SIGUSR1 → finish the step, save, exit 75; Ctrl-C
(SIGINT) in the training loop → the same, exit 130. A second signal exits at once with 128 + signal number: a second
Ctrl-C always, other repeats only after DUPLICATE_WINDOW (SLURM and the launcher each send one SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # preemption: the job script requeues (exit 75)
AT_ONCE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
DUPLICATE_WINDOW = 3.0

_received: list[int] = []
_first_time: list[float] = []
_installed = False
_at_once: list[str] = []  # non-empty: what is running (e.g. "pretrain --dry-run"), ended by the first signal
_startup_ctrl_c: list[int] = []  # Ctrl-C before the loop, in the CLI's process (see interrupt_at_startup)


def _say(text: str) -> None:
    """Write `text` to stderr from a signal handler (rank 0 only: every rank of a launch gets the signal)."""
    if os.environ.get("RANK", "0") == "0":
        with contextlib.suppress(OSError):
            os.write(2, text.encode())


def _exit_now(signum: int, why: str) -> None:
    """Flush what was printed, say why, and exit with 128 + signum (no cleanup, no traceback)."""
    with contextlib.suppress(Exception):  # a flush interrupted mid-write may refuse a reentrant call
        sys.stdout.flush()
    _say(f"\n{why}; exit code {128 + signum}.\n")
    os._exit(128 + signum)


def _handle(signum: int, frame: object) -> None:
    if _at_once:
        _exit_now(signum, f"{_at_once[-1]} stopped by {signal.Signals(signum).name}")
    now = time.monotonic()
    if _received:
        if signum == signal.SIGINT and _received[0] == signal.SIGINT:  # launchers pass Ctrl-C on once: a person
            _exit_now(signum, "Stopped at once by a second Ctrl-C: no checkpoint of the current step (the same "
                              "command resumes from the newest one)")
        if now - _first_time[0] > DUPLICATE_WINDOW:
            os._exit(128 + signum)
        return
    _first_time.append(now)
    _received.append(signum)
    if signum == signal.SIGINT:
        _say("\nCtrl-C: finishing the current step, then saving a checkpoint (Ctrl-C again stops at once).\n")


def install_handlers() -> None:
    """Record SIGTERM/SIGUSR1 instead of dying; the training loop polls `stop_requested`. Under
    `pretrain --dry-run` (seen in sys.argv: this runs before the command line is parsed) the first signal
    ends the process at once instead."""
    global _installed
    if _installed:
        return
    if "--dry-run" in sys.argv[1:] and not _at_once:
        _at_once.append("pretrain --dry-run")
        signal.signal(signal.SIGINT, _handle)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)
    _installed = True


def _interrupt(signum: int, frame: object) -> None:
    _startup_ctrl_c.append(signum)
    raise KeyboardInterrupt


def interrupt_at_startup() -> None:
    """For the CLI's process only: Ctrl-C before the training loop raises KeyboardInterrupt as usual and is also
    recorded, because Python prints and ignores one raised inside a finalizer or weakref callback (a test run lost
    a Ctrl-C in importlib's module-lock callback during startup imports); raise_if_interrupted() raises it again."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not an ignored SIGINT, not a dry run's
        signal.signal(signal.SIGINT, _interrupt)


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a startup Ctrl-C was recorded (and so swallowed, or the process would be gone)."""
    if _startup_ctrl_c:
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_at_once(what: str) -> Iterator[None]:
    """Within the block, the first SIGINT/SIGTERM/SIGUSR1 ends the process at once with 128 + signal number
    (and a stop already recorded ends it on entry). For work that writes nothing, such as a dry run."""
    previous = {sig: signal.getsignal(sig) for sig in AT_ONCE_SIGNALS}
    _at_once.append(what)
    try:
        for sig in AT_ONCE_SIGNALS:
            signal.signal(sig, _handle)
        if _received:
            _exit_now(_received[0], f"{what} stopped by {signal.Signals(_received[0]).name}")
        yield
    finally:
        _at_once.pop()
        for sig, handler in previous.items():  # install_handlers() may have run inside: keep its handlers
            keep = _installed and sig in STOP_SIGNALS
            signal.signal(sig, _handle if keep else handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_saves() -> Iterator[None]:
    """Within the block (the training loop) Ctrl-C is a stop signal: the step finishes and is saved, exit 130.
    Outside, it raises KeyboardInterrupt as usual: before the first step there is nothing to save, and a caller
    in the same process (a notebook, tests) gets its Ctrl-C back afterwards. An ignored SIGINT (`nohup … &`) stays
    ignored."""
    raise_if_interrupted()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGINT, _handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        if _received and _received[0] == signal.SIGINT:  # handled: a later run in this process starts afresh
            _received.clear()
            _first_time.clear()


def stop_requested() -> bool:
    """True once a stop signal has arrived."""
    return bool(_received)


def requeue_requested() -> bool:
    """True once SIGTERM or SIGUSR1 has arrived (a preemption: exit 75), not only a Ctrl-C."""
    return any(signum in STOP_SIGNALS for signum in _received)


def received_signal_name() -> str | None:
    """Name of the first signal received (SIGTERM / SIGUSR1 / SIGINT), or None."""
    return signal.Signals(_received[0]).name if _received else None

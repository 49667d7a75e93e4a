"""SIGTERM / SIGUSR1 → finish the step, save, exit 75 (stdlib only: imported before torch). A second signal
exits at once with 128 + signal number; repeats within DUPLICATE_WINDOW (SLURM plus the launcher) count once."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
AT_ONCE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
DUPLICATE_WINDOW = 3.0

_received: list[int] = []
_first_time: list[float] = []
_installed = False
_at_once: list[str] = []  # non-empty: what is running (e.g. "pretrain --dry-run"), ended by the first signal


def _exit_now(signum: int) -> None:
    """Flush what was printed, say why, and exit with 128 + signum (no cleanup: nothing to save)."""
    with contextlib.suppress(Exception):  # a flush interrupted mid-write may refuse a reentrant call
        sys.stdout.flush()
    name = signal.Signals(signum).name
    with contextlib.suppress(OSError):
        os.write(2, f"\n{_at_once[-1]} stopped by {name}; exit code {128 + signum}.\n".encode())
    os._exit(128 + signum)


def _handle(signum: int, frame: object) -> None:
    if _at_once:
        _exit_now(signum)
    now = time.monotonic()
    if _received and now - _first_time[0] > DUPLICATE_WINDOW:
        os._exit(128 + signum)
    if not _received:
        _first_time.append(now)
    _received.append(signum)


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
            _exit_now(_received[0])
        yield
    finally:
        _at_once.pop()
        for sig, handler in previous.items():  # install_handlers() may have run inside: keep its handlers
            keep = _installed and sig in STOP_SIGNALS
            signal.signal(sig, _handle if keep else handler if handler is not None else signal.SIG_DFL)


def stop_requested() -> bool:
    """True once a stop signal has arrived."""
    return bool(_received)


def received_signal_name() -> str | None:
    """Name of the first signal received (SIGTERM / SIGUSR1), or None."""
    return signal.Signals(_received[0]).name if _received else None

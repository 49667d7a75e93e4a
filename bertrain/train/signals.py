"""SIGTERM / SIGUSR1 → finish the step, save, exit 75. Imported before torch: stdlib only.

The first signal only sets a flag that the training loop polls once per optimizer step (and
all-reduces, so every rank stops after the same step). A second signal means "now": the process
exits at once with 128 + signal number, leaving the previous checkpoint as the resume point.
Signals within DUPLICATE_WINDOW seconds of the first count as the same request: SLURM delivers a
job-step signal to every process of the step, and the launcher (torchrun / accelerate launch)
forwards its own copy too.
"""

from __future__ import annotations

import os
import signal
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DUPLICATE_WINDOW = 3.0

_received: list[int] = []
_first_time: list[float] = []
_installed = False


def _handle(signum: int, frame: object) -> None:
    now = time.monotonic()
    if _received and now - _first_time[0] > DUPLICATE_WINDOW:
        os._exit(128 + signum)
    if not _received:
        _first_time.append(now)
    _received.append(signum)


def install_handlers() -> None:
    """Record SIGTERM/SIGUSR1 instead of dying; the training loop polls `stop_requested`."""
    global _installed
    if _installed:
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)
    _installed = True


def stop_requested() -> bool:
    """True once a stop signal has arrived."""
    return bool(_received)


def received_signal_name() -> str | None:
    """Name of the first signal received (SIGTERM / SIGUSR1), or None."""
    return signal.Signals(_received[0]).name if _received else None

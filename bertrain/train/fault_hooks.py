"""BERTRAIN_TEST_* environment hooks that let the resume tests stop or kill a run at a chosen point.

SIGNAL_AT_STEP=N: rank 0 sends itself SIGTERM during step N. CRASH_AFTER_SAVE=N: kill -9 right after
the checkpoint of step N. CRASH_DURING_SAVE=N: kill -9 halfway through writing it. STEP_DELAY=seconds
slows every step (SLURM test).
"""

from __future__ import annotations

import os
import signal


def hook_step(name: str) -> int | None:
    """The step number BERTRAIN_TEST_<name> names, or None when unset."""
    value = os.environ.get(f"BERTRAIN_TEST_{name}")
    return int(value) if value else None


def step_delay() -> float:
    """Seconds to sleep after every step (BERTRAIN_TEST_STEP_DELAY; 0 when unset)."""
    return float(os.environ.get("BERTRAIN_TEST_STEP_DELAY", "0"))


def kill_now(sig: int = signal.SIGKILL) -> None:
    """Send `sig` to this process (SIGKILL: a crash no handler sees)."""
    os.kill(os.getpid(), sig)

"""BERTRAIN_TEST_* environment hooks that let the resume tests stop or kill a run at a chosen point:
SIGNAL_AT_STEP, CRASH_AFTER_SAVE, CRASH_DURING_SAVE, PAUSE_AT_STEP (rank 0) and STEP_DELAY (every rank)."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

from bertrain.train.signals import stop_requested

KILLS = {"SIGNAL_AT_STEP": signal.SIGTERM, "CRASH_AFTER_SAVE": signal.SIGKILL, "CRASH_DURING_SAVE": signal.SIGKILL}


@functools.cache
def _settings() -> tuple[dict[str, str], bool]:
    """The BERTRAIN_TEST_* values and whether this is rank 0: read once, at the first hook."""
    hooks = {key.removeprefix("BERTRAIN_TEST_"): value for key, value in os.environ.items()
             if key.startswith("BERTRAIN_TEST_") and value}
    return hooks, os.environ.get("RANK", "0") == "0"


def fire(name: str, step: int) -> None:
    """Run hook `name` (a key of KILLS, PAUSE_AT_STEP or STEP_DELAY) at `step` if the environment asks for it.
    PAUSE_AT_STEP=N:FILE writes FILE before step N and waits for a stop signal: a test signals the run then."""
    hooks, rank_zero = _settings()
    if name not in hooks:
        return
    if name == "STEP_DELAY":
        time.sleep(float(hooks[name]))
    elif name == "PAUSE_AT_STEP":
        pause_step, marker = hooks[name].split(":", 1)
        if rank_zero and int(pause_step) == step:
            Path(marker).write_text(str(os.getpid()))
            while not stop_requested():
                time.sleep(0.05)
    elif rank_zero and int(hooks[name]) == step:
        os.kill(os.getpid(), KILLS[name])

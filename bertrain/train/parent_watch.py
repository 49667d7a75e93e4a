"""Stop a worker whose launcher died (after a kill -9 of torchrun its workers go on): on Linux the kernel sends
SIGTERM (PR_SET_PDEATHSIG), handled as usual; elsewhere a daemon thread polls the parent's pid."""

from __future__ import annotations

import os
import signal
from typing import Callable, Optional

from bertrain.child_process import on_parent_death, set_parent_death_signal

LAUNCHER_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")  # set by torchrun and accelerate launch for each worker
POLL_SECONDS = 1.0
_watching = False  # the default watch runs: a second one (a second thread) would send a second SIGTERM


def started_by_launcher() -> bool:
    """True when a launcher (torchrun, accelerate launch) started this process."""
    return any(name in os.environ for name in LAUNCHER_ENV)


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def watch_parent(on_orphaned: Optional[Callable[[], None]] = None, *, poll_seconds: float = POLL_SECONDS) -> bool:
    """Call `on_orphaned` (default: SIGTERM to this process, which Linux sends itself; else a daemon thread polls)
    once the parent dies; True if watching. Only under a launcher: a plain `bertrain pretrain` outlives its shell."""
    if not started_by_launcher():
        return False
    global _watching
    if on_orphaned is None and _watching:  # the CLI started it before `import torch`, the loop asks again
        return True
    parent = os.getppid()
    # The default path must not fire twice: a second SIGTERM more than a few seconds after the first
    # means "exit now, no checkpoint" to the signal handler.
    _watching = on_orphaned is None
    if on_orphaned is None and set_parent_death_signal(signal.SIGTERM):
        if os.getppid() != parent:  # the parent died before prctl took effect
            _terminate_self()
        return True
    # A parent pid of 1 is no sign of orphaning: in a container the launcher itself may be pid 1.
    on_parent_death(parent, on_orphaned or _terminate_self, poll_seconds)
    return True

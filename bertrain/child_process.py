"""Child processes that stop with their parent and get each stop signal exactly once, from it: `bertrain launch`'s
launcher and the demo's stages. In the parent's process group a Ctrl-C or a group-wide SIGTERM reached both, and a
`kill PID` of the parent alone reached neither: the parent died and the child, an orphan, went on training. Also
the parent-death signal itself (Linux's PR_SET_PDEATHSIG), which a worker under a launcher sets for its own sake."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Optional

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def libc_prctl() -> Optional[Callable[..., int]]:
    """libc's prctl (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # the symbols already loaded: libc is among them
    except (OSError, AttributeError):
        return None


def set_parent_death_signal(sig: int = signal.SIGTERM, prctl: Optional[Callable[..., int]] = None) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; False where that is unavailable. Pass
    `prctl` (from `libc_prctl()`) when calling between fork and exec, where nothing may be loaded."""
    prctl = prctl or libc_prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def on_parent_death(parent: int, then: Callable[[], None], poll_seconds: float) -> None:
    """Start a daemon thread that calls `then` once this process's parent is no longer `parent` (where the kernel's
    parent-death signal is not available, or not wanted). `parent` comes from the parent itself when a process may
    start after the death: it then sees another parent, and `then` runs at once."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        then()

    threading.Thread(target=watch, name="bertrain-parent-watch", daemon=True).start()


def run_forwarding_signals(command: list[str], signals: tuple[int, ...], *, to_group: bool = False,
                           new_session: bool = False, env: dict[str, str] | None = None,
                           stdout: IO[Any] | None = None, stderr: IO[Any] | None = None) -> int:
    """Run `command` in its own process group (`new_session`: its own session too), passing it `signals` as they
    reach this process (`to_group`: to its whole group), and SIGTERM should this process die; its exit code
    (128 + N when signal N ended it, as a shell says it). Raises what Popen raises for a command that cannot start."""
    prctl = libc_prctl()  # looked up here: between fork and exec nothing may be loaded

    def start_child() -> None:  # its own group: the terminal's Ctrl-C and a signal to our group reach us only
        if not new_session:
            os.setpgrp()
        set_parent_death_signal(signal.SIGTERM, prctl)  # a kill -9 of this process stops the child too

    started: list[subprocess.Popen] = []
    missed: list[int] = []  # arrived before the child existed: sent once it does

    def forward(signum: int, frame: object) -> None:
        if not started:
            missed.append(signum)
            return
        try:
            os.killpg(started[0].pid, signum) if to_group else started[0].send_signal(signum)
        except ProcessLookupError:
            pass  # it has already exited

    previous = {number: signal.signal(number, forward) for number in signals}  # before the child: no gap
    try:
        started.append(subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr,
                                        start_new_session=new_session, preexec_fn=start_child))
        for signum in missed:
            forward(signum, None)
        code = started[0].wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 128 - code if code < 0 else code

"""A child process that gets each stop signal exactly once, from its parent (the demo's stages). In the parent's
process group a Ctrl-C or a group-wide SIGTERM reached both, while a `kill PID` of the parent alone reached
neither: the parent died and the stage, an orphan, trained on."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import IO, Any

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_forwarding_signals(command: list[str], env: dict[str, str] | None = None,
                           stdout: IO[Any] | None = None) -> int:
    """Run `command` in its own process group, passing it SIGINT, SIGTERM and SIGHUP as they reach this process;
    its exit code (128 + N when a signal killed it, as a shell says it)."""
    # Its own group: the terminal's Ctrl-C and a signal to our group reach this process only, which passes them on.
    process = subprocess.Popen(command, env=env, stdout=stdout, preexec_fn=os.setpgrp)
    previous = {number: signal.signal(number, lambda signum, frame: process.send_signal(signum))
                for number in FORWARDED}
    try:
        code = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 128 - code if code < 0 else code

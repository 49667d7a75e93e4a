"""SIGTERM / SIGUSR1 → finish the step, save, exit 75. Imported before torch: stdlib only."""

import signal

_received: list[int] = []


def install_handlers() -> None:
    """Record SIGTERM/SIGUSR1 instead of dying; the training loop polls `stop_requested`."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: _received.append(signum))


def stop_requested() -> bool:
    return bool(_received)

"""Console output: rich consoles, sizes and durations in words, warnings given once per process. Off a terminal
a message stays on one line (logs are grepped, commands copied into shells); rich would wrap at 80 columns."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console

# Width of tables and rules when the stream is not a terminal and COLUMNS is unset (rich assumes 80).
WIDTH_WHEN_NOT_A_TERMINAL = 200
_warned: set[str] = set()


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (a closed or fake stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def make_console(stderr: bool = False, **kwargs: Any) -> Console:
    """A Console on stdout (or stderr, or `file=`); off a terminal lines never wrap and tables get a fixed width."""
    stream = kwargs.get("file") or (sys.stderr if stderr else sys.stdout)
    if is_terminal(stream):
        return Console(stderr=stderr, **kwargs)
    kwargs.setdefault("soft_wrap", True)
    if not os.environ.get("COLUMNS"):
        kwargs.setdefault("width", WIDTH_WHEN_NOT_A_TERMINAL)
    return Console(stderr=stderr, **kwargs)


def first_time(key: str) -> bool:
    """True the first time this process asks about `key`: how a warning is given only once."""
    if key in _warned:
        return False
    _warned.add(key)
    return True


def human_bytes(n: float) -> str:
    """1536 → '1.5 KB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def human_seconds(seconds: float) -> str:
    """3725 → '1h02m', 65 → '1m05s', 200000 → '2.3 days', 1e8 → '3.2 years'."""
    if seconds >= 365.25 * 86400:
        return f"{seconds / (365.25 * 86400):,.1f} years"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    hours, rest = divmod(int(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"

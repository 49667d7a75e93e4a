"""Rich consoles for bertrain's output: wrapped for a person at a terminal, one line per message otherwise.

Not on a terminal (a log file, SLURM output, a pipe) the output is grepped and its commands are copied
into shells, so a message must stay on one line: rich would otherwise wrap everything at 80 columns.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console

# Width of tables and rules when the stream is not a terminal and COLUMNS is unset (rich assumes 80).
WIDTH_WHEN_NOT_A_TERMINAL = 200


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (a closed or fake stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def make_console(stderr: bool = False, **kwargs: Any) -> Console:
    """A Console on stdout (or stderr, or `file=`); when that is not a terminal, lines never wrap (`soft_wrap`) and
    tables get WIDTH_WHEN_NOT_A_TERMINAL columns unless COLUMNS says otherwise."""
    stream = kwargs.get("file") or (sys.stderr if stderr else sys.stdout)
    if is_terminal(stream):
        return Console(stderr=stderr, **kwargs)
    kwargs.setdefault("soft_wrap", True)
    if not os.environ.get("COLUMNS"):
        kwargs.setdefault("width", WIDTH_WHEN_NOT_A_TERMINAL)
    return Console(stderr=stderr, **kwargs)

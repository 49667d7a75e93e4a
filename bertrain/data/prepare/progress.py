"""Progress of the long prepare stages (reading, tokenizing): a live bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeRemainingColumn, \
    TransferSpeedColumn

from bertrain.console import human_seconds

# Off a terminal (a log file, SLURM output) a stage prints where it is this often, with an ETA.
PLAIN_LINE_SECONDS = 30.0


class LineProgress(Progress):
    """A rich Progress that, when its console is not a terminal (where rich draws nothing until the end),
    prints one plain line per task every PLAIN_LINE_SECONDS: done %, MB, documents/s and the ETA."""

    def __init__(self, *columns: Any, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self._last_line: dict[TaskID, float] = {}

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        if self.console.is_terminal:
            return
        now = time.monotonic()
        last = self._last_line.setdefault(task_id, now)
        if now - last >= PLAIN_LINE_SECONDS:
            self._last_line[task_id] = now
            self.console.print(plain_line(self._tasks[task_id]), highlight=False)


def plain_line(task: Any) -> str:
    """'tokenizing 45% (12.3 / 27.1 MB), 1,234 docs 300/s, ETA 1m05s' for one task."""
    share = f"{task.percentage:.0f}% " if task.total else ""
    size = f"({task.completed / 1e6:,.1f} / {task.total / 1e6:,.1f} MB)" if task.total else \
        f"({task.completed / 1e6:,.1f} MB)"
    remaining = task.time_remaining
    eta = "unknown" if remaining is None else human_seconds(remaining)
    return (f"{task.description} {share}{size}, {task.fields.get('docs', 0):,} docs "
            f"{task.fields.get('rate', 0.0):,.0f}/s, ETA {eta}")


def progress_bar(console: Any) -> Progress:
    """A progress bar with documents/s, MB/s (of input or of text to tokenize) and ETA."""
    return LineProgress(TextColumn("[bold]{task.description:<10}"), BarColumn(bar_width=20), TaskProgressColumn(),
                        TextColumn("{task.fields[docs]:>9,} docs {task.fields[rate]:>7,.0f}/s"),
                        TransferSpeedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                        console=console, transient=False)


class Rate:
    """Documents per second since this object was made."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, docs: int) -> float:
        return docs / max(time.perf_counter() - self.start, 1e-6)

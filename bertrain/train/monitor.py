"""Where training metrics go (rank 0 only): a rich progress line, RUN_DIR/metrics.jsonl, and wandb."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Column, Table
from rich.text import Text

from bertrain import rundir
from bertrain.config import Config, LoggingConfig, to_dict
from bertrain.console import first_time, human_seconds, make_console
from bertrain.errors import DataError
from bertrain.files import write_atomic

EVAL_LINE_SECONDS = 30.0  # off a terminal, a long evaluation says where it is this often
SLOW_SHARE = 0.5  # a throughput below this share of the one measured at the start is pointed out


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every record of RUN_DIR/metrics.jsonl (train and eval). A torn last line (a full disk or a kill during
    an append) is skipped with one warning; a bad line before the last is a DataError naming it."""
    return _read_records(Path(run_dir) / rundir.METRICS)[0]


def _read_records(path: Path) -> tuple[list[dict], bool]:
    """(records, whether the file needs a rewrite: a torn last line or no final newline)."""
    if not path.is_file():
        return [], False
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict] = []
    for index, line in enumerate(lines[:last + 1]):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            record, reason = None, error.msg
        else:
            reason = "not a JSON object"
        if isinstance(record, dict):
            records.append(record)
        elif index == last:
            if first_time(f"torn line in {path}"):
                make_console(stderr=True).print(
                    f"[yellow]Warning:[/] {path} ends in a torn line ({len(line)} characters: a full disk or a kill "
                    f"during an append); it is skipped (a resumed run removes it from the file).", highlight=False)
            return records, True
        else:
            raise DataError(f"{path}, line {index + 1}: not a metrics record ({reason}). The file only holds "
                            f"logged metrics: delete that line (or the file) and run again.")
    return records, bool(text) and not text.endswith("\n")


def truncate_metrics(run_dir: str | Path, last_step: int) -> int:
    """Drop records after `last_step`, and a torn last line; returns how many were dropped."""
    path = Path(run_dir) / rundir.METRICS
    records, needs_rewrite = _read_records(path)
    kept = [r for r in records if r.get("step", 0) <= last_step]
    if len(kept) != len(records) or needs_rewrite:
        text = "".join(json_line(r) for r in kept)
        write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return len(records) - len(kept)


def json_line(record: dict) -> str:
    """One metrics.jsonl line in strict JSON: a NaN or infinite value (a diverged step's grad norm) is null, since
    Python's bare `NaN`/`Infinity` break jq, JavaScript and other strict readers of the file."""
    def strict(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: strict(item) for key, item in value.items()}
        return [strict(item) for item in value] if isinstance(value, (list, tuple)) else value

    return json.dumps(strict(record), allow_nan=False) + "\n"


def _short(value: Any) -> str:
    if isinstance(value, float):
        if value != value or math.isinf(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.4f}"
    return str(value)


def slowness_note(tokens_per_s: float, estimate: float) -> str | None:
    """What the progress says when the throughput is far below the estimate measured at the start."""
    if estimate <= 0 or tokens_per_s >= SLOW_SHARE * estimate:
        return None
    return (f"running at {tokens_per_s / estimate:.1f}x the estimate ({tokens_per_s:,.0f} of {estimate:,.0f} "
            f"tokens/s measured on one micro-batch): other processes use the CPU (train.threads)")


class NullMonitor:
    """What non-zero ranks use: every call does nothing."""

    def start(self, *args: Any, **kwargs: Any) -> None: ...
    def expect(self, *args: Any, **kwargs: Any) -> None: ...
    def log(self, *args: Any, **kwargs: Any) -> None: ...
    def event(self, *args: Any, **kwargs: Any) -> None: ...
    def advance(self, *args: Any, **kwargs: Any) -> None: ...
    def eval_progress(self, *args: Any, **kwargs: Any) -> None: ...
    def message(self, *args: Any, **kwargs: Any) -> None: ...
    def warn(self, *args: Any, **kwargs: Any) -> None: ...
    def close(self, *args: Any, **kwargs: Any) -> None: ...


class Monitor(NullMonitor):
    """Rank 0's progress (a live bar, or one line per logged step with an ETA), metrics file and wandb."""

    def __init__(self, run_dir: Path, config: Config, console: Console) -> None:
        self.run_dir, self.config, self.console = Path(run_dir), config, console
        self.metrics_path = self.run_dir / rundir.METRICS
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.eval_task: TaskID | None = None
        self.wandb_run = None
        self.live = console.is_terminal
        self.total_steps, self.clock = 0, (time.monotonic(), 0)
        self.eval_clock = (time.monotonic(), time.monotonic())  # (evaluation start, last line printed)
        # tokens/s measured at the start (train/threads.py); whether a train record was logged; said it's slow
        self.estimate, self.logged, self.slow = 0.0, False, False

    def expect(self, tokens_per_s: float) -> None:
        """The throughput measured on one micro-batch: a logged one far below it is pointed out."""
        self.estimate = tokens_per_s

    def start(self, start_step: int, total_steps: int) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps, self.clock = total_steps, (time.monotonic(), start_step)
        self.wandb_run = init_wandb(self.config.logging, self.run_dir, to_dict(self.config), self.warn)
        if self.live:
            self.progress = progress_bar(self.console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, metrics="")

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def eta(self, step: int) -> str:
        """Time left to total_steps at this session's mean step rate so far (evaluation and saves included)."""
        began, first_step = self.clock
        done = step - first_step
        if done <= 0:
            return "unknown"
        return human_seconds(max(self.total_steps - step, 0) * (time.monotonic() - began) / done)

    def eval_progress(self, done: int, total: int) -> None:
        """Validation micro-batch `done` of `total`: a transient bar, else a line every EVAL_LINE_SECONDS."""
        now = time.monotonic()
        if done == 0:
            self.eval_clock = (now, now)
        if self.progress is not None:
            if done == 0:
                self.eval_task = self.progress.add_task("eval", total=total, metrics="")
            self.progress.update(self.eval_task, completed=done)
            if done >= total:
                self.progress.remove_task(self.eval_task)
            return
        began, last = self.eval_clock
        if 0 < done < total and now - last >= EVAL_LINE_SECONDS:
            self.eval_clock = (began, now)
            left = (total - done) * (now - began) / done
            self.console.print(f"eval batch {done} / {total}, ETA {human_seconds(left)}", highlight=False)

    def log(self, record: dict[str, Any]) -> None:
        """Append one record (train or eval) to metrics.jsonl, wandb and the progress line."""
        record = self.event(**record)
        kind = record.get("kind", "train")
        if self.wandb_run is not None:
            prefix = "eval/" if kind == "eval" else "train/"
            self.wandb_run.log({prefix + k: v for k, v in record.items() if k not in ("step", "kind", "time")},
                               step=record["step"])
        keys = ("loss", "mlm_accuracy", "lr", "tokens_per_s") if kind == "train" else (
            "mlm_loss", "mlm_accuracy", "sentence_accuracy")
        text = " ".join(f"{k}={record[k]:.0f}" if k == "tokens_per_s" else f"{k}={_short(record[k])}"
                        for k in keys if record.get(k) is not None)
        # The first window holds the first steps' one-time costs: compared from the second on.
        note = slowness_note(record["tokens_per_s"], self.estimate) if kind == "train" and self.logged else None
        self.logged = self.logged or kind == "train"
        if note and not self.slow:  # once each time it becomes slow
            self.warn(f"step {record['step']}: {note}.")
        self.slow = note is not None
        if self.progress is not None and kind == "train":
            self.progress.update(self.task, metrics=text)
        elif self.progress is not None:
            self.progress.console.print(f"eval step {record['step']}: {text}", highlight=False)
        elif kind == "train":  # not a terminal (job logs): one line per record, where the run is and when it ends
            step = record["step"]
            share = f" ({100 * step / self.total_steps:.1f}%)" if self.total_steps else ""
            self.console.print(f"train step {step} / {self.total_steps}{share}: {text} ETA {self.eta(step)}",
                               highlight=False)
        else:
            self.console.print(f"eval step {record['step']}: {text}", highlight=False)

    def event(self, kind: str, step: int, **fields: Any) -> dict:
        """Append one record to metrics.jsonl only: train, eval, and the marks `bertrain report` draws."""
        record = {"kind": kind, "step": step, **fields, "time": time.time()}
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json_line(record))
        return record

    def message(self, text: str) -> None:
        (self.progress.console if self.progress is not None else self.console).print(text, highlight=False)

    def warn(self, text: str) -> None:
        self.message(f"[yellow]Warning:[/] {text}")

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if summary:
            with contextlib.suppress(OSError):  # a full disk: the error being raised says so
                self.event("stop", summary["step"], reason=summary["result"])
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.wandb_run is not None:
            if summary:
                for key, value in summary.items():
                    self.wandb_run.summary[key] = value
            self.wandb_run.finish()
            self.wandb_run = None
        if summary:
            table = Table(title="pretrain summary")
            table.add_column("", style="cyan")
            table.add_column("value", style="green", justify="right", overflow="fold")  # a long path: whole
            for key, value in summary.items():
                table.add_row(key, _short(value))
            self.console.print(table)


class MetricsColumn(TextColumn):
    """The progress line's metrics: the one column that gives way in a narrow terminal, cut at its end."""

    def __init__(self) -> None:
        # A wrappable column is the one rich's table narrows first; the text itself never wraps to a second line.
        super().__init__("{task.fields[metrics]}", table_column=Column(no_wrap=False, overflow="ellipsis"))

    def render(self, task) -> Text:
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


# A redraw on a terminal is ~2 ms of Python under the GIL (2-core AMD EPYC): rich's default 10 a second took 2% of
# the time of the thread that launches the GPU kernels, which is the limit of a loop the host limits
REDRAWS_PER_SECOND = 2


def progress_bar(console: Console) -> Progress:
    """Step / total, %, elapsed time and ETA, never cut (no_wrap), then the metrics, which give way to them."""
    fixed = {"table_column": Column(no_wrap=True)}
    return Progress(TextColumn("[bold]{task.description}", **fixed), MofNCompleteColumn(**fixed),
                    TaskProgressColumn(**fixed), BarColumn(bar_width=16, **fixed), TimeElapsedColumn(**fixed),
                    TextColumn("ETA", **fixed), TimeRemainingColumn(**fixed), MetricsColumn(),
                    console=console, transient=False, refresh_per_second=REDRAWS_PER_SECOND)


def init_wandb(config: LoggingConfig, run_dir: Path, tree: dict, warn: Callable[[str], None]) -> Any:
    """A wandb run, or None when logging.wandb is off. Online without network falls back to offline."""
    if config.wandb == "off":
        return None
    import wandb  # about a second to import, and only runs that log to wandb need it

    id_file = run_dir / rundir.WANDB_ID
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
    id_file.write_text(run_id)
    common = dict(project=config.wandb_project, name=config.wandb_run_name or run_dir.resolve().name,
                  dir=str(run_dir), config=tree, id=run_id, resume="allow")
    mode = os.environ.get("WANDB_MODE", config.wandb) if config.wandb == "online" else config.wandb
    if mode == "online":
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=config.wandb_init_timeout), **common)
        except Exception as error:  # no network, bad key, server down: keep training, log offline
            warn(f"wandb online init failed ({type(error).__name__}: {str(error)[:200]}); logging offline "
                 f"to {run_dir}/wandb instead (upload later with `wandb sync`).")
            mode = "offline"
            with contextlib.suppress(Exception):
                wandb.teardown()  # the failed run's id stays registered in the wandb service otherwise
    return wandb.init(mode=mode, **common)

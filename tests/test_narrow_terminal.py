"""A narrow terminal (issue 26.3): the progress line keeps step / total, % and the ETA whole and lets the metrics
give way; tables of paths fold a long path instead of cutting it."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from bertrain.config import load_config
from bertrain.demo import DemoResult, print_summary
from bertrain.train.monitor import Monitor, progress_bar

METRICS = "loss=7.6515 mlm_accuracy=0.0525 lr=0.00283 tokens_per_s=18833"
LONG_PATH = ("/home/someone/projects/pretraining-experiments/" + "a-rather-long-run-name-" * 3
             + "/checkpoints/step-00001200")


def terminal(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None, record=True)


def progress_line(width: int) -> str:
    """The progress line of step 105 of 2400 after 10 s at 10.5 steps/s."""
    console, now = terminal(width), [0.0]
    progress = progress_bar(console)
    progress.get_time = lambda: now[0]
    task = progress.add_task("train", total=2400, completed=0, metrics="")
    for step in range(0, 106, 15):  # the speed rich's ETA uses comes from these samples
        now[0] = step / 10.5
        progress.update(task, completed=step)
    progress.update(task, completed=105, metrics=METRICS)
    now[0] = 10.0
    console.print(progress.get_renderable())
    lines = console.export_text().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= width, lines
    return lines[0]


@pytest.mark.parametrize("width", [80, 100, 200])
def test_step_percent_and_eta_are_never_cut(width):
    line = progress_line(width)
    assert line.startswith("train  105/2400   4% ")
    assert " 0:00:10 ETA 0:03:39 " in line  # elapsed, then the time left at 10.5 steps/s: 2295 / 10.5 = 218.6 s


def test_the_training_progress_line_is_redrawn_at_most_twice_a_second():
    """A redraw is ~2 ms of Python under the GIL on a terminal: at rich's default 10 a second it took 2% of the time
    of the thread that launches a GPU step's kernels. A slow machine only redraws less often."""
    progress = progress_bar(terminal(120))
    redraws, redraw = [], progress.live.refresh
    progress.live.refresh = lambda: (redraws.append(time.monotonic()), redraw())
    progress.add_task("train", total=100, completed=0, metrics=METRICS)
    with progress:
        time.sleep(1.5)
    assert 1 <= len(redraws) <= 2 * 1.5 + 2, redraws  # + one at the start and one at the stop


def test_the_metrics_give_way_and_show_when_there_is_room():
    narrow, medium, wide = progress_line(80), progress_line(100), progress_line(200)
    assert "loss=7.6515" in narrow and narrow.endswith("…") and "tokens_per_s" not in narrow
    assert "mlm_accuracy=0.0525" in medium and "tokens_per_s" not in medium
    assert wide.endswith(METRICS)


def cell_text(rendered: str, key: str) -> str:
    """The right-hand cell of the table row starting with `key`, joined across the lines it was folded onto."""
    lines = rendered.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip("│ ").startswith(key))
    parts = []
    for line in lines[start:]:
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if not cells or (parts and cells[0]):  # the next row (or the table's end)
            break
        parts.append(cells[-1])
    return "".join(parts)


@pytest.mark.parametrize("width", [80, 100])
def test_the_pretrain_summary_folds_the_checkpoint_path(tmp_path, width):
    console = terminal(width)
    monitor = Monitor(tmp_path, load_config(None), console)
    monitor.close({"result": "finished", "step": 1200, "checkpoint": LONG_PATH})
    rendered = console.export_text()
    assert "…" not in rendered and cell_text(rendered, "checkpoint") == LONG_PATH


def test_the_demo_table_of_written_paths_folds_them():
    console = terminal(80)
    paths = {key: f"{LONG_PATH}/{key}" for key in ("corpus", "recipe", "data", "run", "model", "summary")}
    print_summary(DemoResult(model="albert", out="x", paths=paths), console)
    rendered = console.export_text()
    assert cell_text(rendered, "prepared data (DATA_DIR)") == paths["data"]
    assert cell_text(rendered, "Hugging Face model") == paths["model"]

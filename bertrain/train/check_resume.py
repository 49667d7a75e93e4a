"""`bertrain pretrain --check-resume`: three fresh processes in a scratch directory (a 2N-step reference, a run
stopped at N, that run resumed) whose losses of steps N+1..2N and final weights must be equal exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.table import Table
from safetensors.torch import load_file

from bertrain import rundir
from bertrain.errors import DataError, UsageError
from bertrain.train.monitor import read_metrics

CHECK_STEPS = 3  # N: the stop (and checkpoint) step; the runs train 2N steps


def check_resume(config: str, overrides: list[str], data_dir: str | None, console, steps: int = CHECK_STEPS) -> int:
    """Run the three runs, print the comparison; 0 when the resumed run is bitwise identical, else 1."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("--check-resume runs its own short runs in one process: start it without a launcher "
                         "(plain `bertrain pretrain … --check-resume`).")
    scratch = Path(tempfile.mkdtemp(prefix="bertrain-check-resume-"))
    command = [sys.executable, "-m", "bertrain", "pretrain", "--config", config,
               *(["--data", data_dir] if data_dir else []),
               *[arg for override in overrides for arg in ("--set", override)],
               "--set", f"train.max_steps={2 * steps}", "--set", f"train.save_every={steps}",
               "--set", "train.eval_every=0", "--set", "train.log_every=1", "--set", "logging.wandb=off"]
    reference, resumed = scratch / "reference", scratch / "resumed"
    console.print(f"Checking exact resume with {2 * steps} steps of this config and data in {scratch}", highlight=False)
    _run_stage(console, f"1/3 reference: steps 1-{2 * steps}", command + ["--run-dir", str(reference)])
    _run_stage(console, f"2/3 stopped after the checkpoint of step {steps}",
               command + ["--run-dir", str(resumed), "--set", f"train.stop_at_step={steps}"])
    _run_stage(console, f"3/3 resumed by the same command: steps {steps + 1}-{2 * steps}",
               command + ["--run-dir", str(resumed)])
    if _compare(reference, resumed, steps, console):
        shutil.rmtree(scratch, ignore_errors=True)
        console.print(f"PASS: resuming at step {steps} gave bitwise the same losses and weights as the run that "
                      f"never stopped.", highlight=False)
        return 0
    console.print(f"FAIL: the resumed run differs (runs kept in {scratch}). On a GPU set train.deterministic=true "
                  f"(non-deterministic kernels differ from run to run); otherwise please report it with that "
                  f"directory.", highlight=False)
    return 1


def _run_stage(console, title: str, command: list[str]) -> None:
    console.print(f"  {title} …", highlight=False)
    env = dict(os.environ, WANDB_MODE="disabled")
    # One thread count for all three runs: `train.threads: auto` could choose differently in each (another
    # process's load), and the count changes float rounding. A number in the config still applies.
    env.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.strip().splitlines()[-15:])
        raise DataError(f"--check-resume: the run '{title}' ended with exit {result.returncode}:\n{tail}")


def _compare(reference: Path, resumed: Path, steps: int, console) -> bool:
    """Print the per-step losses side by side; whether losses and final weights are bitwise equal."""
    losses = [{r["step"]: r["loss"] for r in read_metrics(run) if r.get("kind") == "train"}
              for run in (reference, resumed)]
    table = Table(title="training loss, reference vs resumed")
    for column in ("step", "reference", "resumed", "same"):
        table.add_column(column, justify="right")
    same = True
    for step in range(steps + 1, 2 * steps + 1):
        first, second = losses[0].get(step), losses[1].get(step)
        equal = first is not None and first == second
        same &= equal
        table.add_row(str(step), repr(first), repr(second), "yes" if equal else "NO")
    weights = [load_file(str(rundir.checkpoints_dir(run) / rundir.checkpoint_name(2 * steps) / rundir.WEIGHTS))
               for run in (reference, resumed)]
    weights_equal = weights[0].keys() == weights[1].keys() and all(
        torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    table.add_row("final weights", "", "", "yes" if weights_equal else "NO")
    console.print(table)
    return same and weights_equal

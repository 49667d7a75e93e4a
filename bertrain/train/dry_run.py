"""`pretrain --dry-run`: size and disk needs, then a step time measured on one micro-batch when that is quick
(QUICK_SECONDS by FLOPs), else from FLOPs alone. Rank 0 only; a signal ends it at once (`stop_at_once`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bertrain.config import Config
from bertrain.console import human_bytes, human_seconds
from bertrain.data.loader import epoch_tokens
from bertrain.data.workers import choose_workers
from bertrain.errors import BertrainError
from bertrain.train import fault_hooks
from bertrain.train.checkpoint import choose_checkpoint, data_info
from bertrain.train.resume_rules import resumed_state
from bertrain.train.setup import choose_compile
from bertrain.train.step_cost import MATMUL_SHARE, matmul_rate, measure_micro_batch, training_flops
from bertrain.train.stream import TrainStream
from bertrain.train.threads import ThreadPlan, ThreadTuner, plan_threads

QUICK_SECONDS = 10.0
# More passes over the training data than this are warned about (a plan of 13,889 epochs once went unremarked).
MAX_EPOCHS_UNREMARKED = 100
WHOLE_WARMUP_SECONDS = 2.0


def measure_as_the_run_would(model, accelerator, batch: dict, warmup_rows: int, plan: ThreadPlan | None,
                             expected: float, console: Console) -> tuple[float, str]:
    """(seconds, at which thread count) of one micro-batch: under `train.threads: auto` (when quick enough) timed
    and chosen by the run's own ThreadTuner, as another job on the cores changes which count wins (2 threads took
    0.96 s, 1 thread 0.13 s on a shared 2-core CPU)."""
    passes = 2 * len(plan.candidates) + 1 if plan is not None else 0  # a warm-up, then two alternated per count
    if plan is None or not plan.auto or expected * passes > QUICK_SECONDS:
        return measure_micro_batch(model, accelerator, batch, warmup_rows), ""
    tuner = ThreadTuner(plan, model, accelerator, batch)
    _say(console, tuner.probe() or "")
    return tuner.tokens / tuner.estimate, f"{tuner.threads} thread(s), as train.threads auto would choose"


def best_matmul_rate(accelerator, plan: ThreadPlan | None) -> float:
    """The matmul rate at the fastest thread count `train.threads: auto` compares: on a busy CPU the default count
    ran 5x slower than one thread (19.5 vs 97 GFLOP/s), so the estimate was skipped or timed at the wrong count."""
    if plan is None or not plan.auto:
        return matmul_rate(accelerator)
    default, rates = torch.get_num_threads(), []
    try:
        for count in plan.candidates:
            torch.set_num_threads(count)
            rates.append(matmul_rate(accelerator))
    finally:
        torch.set_num_threads(default)
    return max(rates)


def repetition_warning(config: Config, epoch_length: int, total_steps: int) -> str | None:
    """A warning when the plan passes over the training data more than MAX_EPOCHS_UNREMARKED times, else None."""
    steps_per_epoch = epoch_length / config.train.gradient_accumulation_steps
    epochs = total_steps / max(steps_per_epoch, 1e-9)
    if not epoch_length or epochs <= MAX_EPOCHS_UNREMARKED:
        return None
    max_tokens = config.train.max_tokens
    budget = (f"train.max_steps={math.ceil(MAX_EPOCHS_UNREMARKED * steps_per_epoch)}" if max_tokens is None else
              f"train.max_tokens={math.ceil(max_tokens * MAX_EPOCHS_UNREMARKED / epochs)}")
    return (f"the plan repeats the training data {epochs:,.0f} times ({total_steps:,} steps, {steps_per_epoch:,.1f} "
            f"per epoch): repeated data teaches less than new data, and a model can overfit a small corpus. Add data "
            f"(more documents or sources in `bertrain prepare`), or train fewer steps: --set {budget} is "
            f"{MAX_EPOCHS_UNREMARKED} epochs.")


def _figures(config: Config, prepared, world: int, micro_batch_size: int, num_parameters: int,
             checkpoint_bytes: int, epoch_length: int, total_steps: int | None) -> Table:
    """The table of what needs no measurement (steps and epochs `-` when the data fills no micro-batch)."""
    train = config.train
    steps_per_epoch = epoch_length / train.gradient_accumulation_steps
    disk = checkpoint_bytes * (train.keep_last + 1)
    tokens = int(prepared.manifest["splits"]["train"]["tokens"])  # with no micro-batch to plan: the corpus
    if epoch_length:
        tokens = epoch_tokens(prepared, config.data, seed=train.seed, epoch=0,
                              instances=epoch_length * micro_batch_size * world)
    epochs = f"{total_steps / steps_per_epoch:,.2f}" if total_steps and steps_per_epoch else "-"
    return _table(f"pretrain --dry-run ({world} process(es))", [
        ("model", f"{config.model.type}, vocab {config.model.vocab_size}"),
        ("parameters", f"{num_parameters:,}"),
        ("tokens per epoch", f"{tokens:,}" + (" (its instances: pairs, special tokens)" if epoch_length else "")),
        ("sequences per step", f"{train.batch_size:,} x {config.data.max_seq_length} tokens"),
        ("micro-batch per process", f"{micro_batch_size} x {train.gradient_accumulation_steps} accumulation"),
        ("steps per epoch", f"{steps_per_epoch:,.1f}" if epoch_length else "0 (less data than one micro-batch)"),
        ("total steps", f"{total_steps:,}" if total_steps is not None else "-"),
        ("epochs", epochs),
        ("checkpoint size", human_bytes(checkpoint_bytes)),
        ("disk needed", f"{human_bytes(disk)} (keep_last {train.keep_last} + 1 while saving)")])


def _table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title)
    table.add_column("", style="cyan")
    table.add_column("value", style="green", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _say(console: Console, text: str) -> None:
    console.print(text, highlight=False)
    console.file.flush()  # shown before the (possibly long) work that follows, and kept if a signal ends it


def estimate_time(model, accelerator, console: Console, config: Config, prepared, micro_batch_size: int,
                  total_steps: int) -> None:
    """Print the time estimate: measured on one micro-batch when that is quick, else skipped with the reason."""
    train, data = config.train, config.data
    accumulation = train.gradient_accumulation_steps
    flops = training_flops(config.model, micro_batch_size, data.max_seq_length, data.mlm_probability)
    # once: it sets a fixed count as it plans
    plan = plan_threads(train.threads, device_type=accelerator.device.type, world_size=accelerator.num_processes,
                        deterministic=train.deterministic, compiled=train.compile is True)
    rate = best_matmul_rate(accelerator, plan)
    expected = flops / (rate * MATMUL_SHARE)
    shape = f"{micro_batch_size} x {data.max_seq_length} tokens"
    if expected > QUICK_SECONDS:
        _say(console, f"estimate skipped: one micro-batch ({shape}, {flops / 1e12:,.1f} TFLOP forward + backward) "
                      f"would take ~{human_seconds(expected)} on {accelerator.device} ({rate / 1e9:,.0f} GFLOP/s "
                      f"matmul), over the {QUICK_SECONDS:.0f} s a dry run spends.")
        _say(console, f"rough time from FLOPs alone (not measured): ~{human_seconds(expected * accumulation)} "
                      f"per step, ~{human_seconds(expected * accumulation * total_steps)} for {total_steps:,} "
                      f"steps on this device.")
        return
    _say(console, f"measuring one micro-batch ({shape}, forward + backward, expected under "
                  f"{max(expected, 0.1):.1f} s)…")
    stream = TrainStream(prepared, data, seed=train.seed, micro_batch_size=micro_batch_size, rank=0,
                         world_size=accelerator.num_processes, epoch=0, micro_batch=0)
    try:
        # Warm up on the whole micro-batch when that is cheap: a first pass at a new shape ran ~10x slower here.
        batch = stream.next()
        warmup_rows = len(batch["input_ids"]) if expected <= WHOLE_WARMUP_SECONDS else 1
        seconds, threads = measure_as_the_run_would(model, accelerator, batch, warmup_rows, plan, expected,
                                                    console)
        fault_hooks.fire("STEP_DELAY", 0)  # after the measurement: a slow dry run for the signal test
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and "memory" not in str(error):
            raise
        _say(console, f"estimate skipped: one micro-batch ({shape}) does not fit in memory on "
                      f"{accelerator.device} ({type(error).__name__}); raise train.gradient_accumulation_steps.")
        return
    step = seconds * accumulation
    compiled, why = choose_compile(train, accelerator.device, total_steps)
    console.print(_table("time estimate", [
        ("one micro-batch (measured)", f"{seconds:.3f} s" + (f" ({threads})" if threads else "")),
        ("measured step time", f"{step:.3f} s ({accumulation} micro-batch(es))"),
        ("estimated time", f"{human_seconds(step * total_steps)} (without evaluation and checkpoints)"),
        ("torch.compile", f"on ({why}): measured eager; the run's compiled step should be faster" if compiled
         else f"off ({why})"),
        ("data.num_workers", choose_workers(data.num_workers).describe())]))


@dataclass
class ResumeRequest:
    """What the command line asked of RUN_DIR's checkpoints (--resume, --force, --trust-checkpoint)."""

    run_dir: Path
    resume: str
    force: bool
    trust: bool


def resume_preview(request: ResumeRequest, config: Config, prepared, world: int, micro_batch_size: int,
                   total_steps: int | None, console: Console) -> str:
    """What the real run would do with RUN_DIR's checkpoints, said without taking its lock or moving anything."""
    if request.resume == "restart":
        return ("The run would move RUN_DIR's checkpoints, metrics and tokenizer aside (--resume restart) and start "
                "at step 0.")
    try:
        found = choose_checkpoint(request.resume, request.run_dir, request.trust, console)
        if found is None:
            return "The run would start at step 0 (no checkpoint to resume)."
        state = resumed_state(found, config, data_info(prepared), world, micro_batch_size, request.force).state
    except BertrainError as error:
        return f"[yellow]The run would stop here[/] (exit {error.exit_code}): {escape(str(error))}"
    left = f", {total_steps - state.step:,} of the {total_steps:,} steps left" if total_steps else ""
    return f"The run would resume from {found} (step {state.step:,}{left}); the figures are the whole run's."


def report_dry_run(model, accelerator, console: Console, config: Config, prepared, *, micro_batch_size: int,
                   num_parameters: int, checkpoint_bytes: int, epoch_length: int, total_steps: int | None,
                   problem: Exception | None = None, resume: ResumeRequest | None = None) -> int:
    """Print the run's size at once, what it would resume, then a time estimate (rank 0); write nothing. Returns
    the exit code, 0. With `problem` (the data fills no micro-batch: epoch_length 0), the size, then `problem`."""
    if accelerator.is_main_process:
        console.print(_figures(config, prepared, accelerator.num_processes, micro_batch_size, num_parameters,
                               checkpoint_bytes, epoch_length, total_steps))
        if resume is not None:
            _say(console, resume_preview(resume, config, prepared, accelerator.num_processes, micro_batch_size,
                                         total_steps, console))
        warning = repetition_warning(config, epoch_length, total_steps or 0)
        if warning:
            _say(console, f"[yellow]Warning:[/] {warning}")
        console.file.flush()
    if problem is not None:
        raise problem
    if accelerator.is_main_process:
        estimate_time(model, accelerator, console, config, prepared, micro_batch_size, total_steps or 0)
    return 0

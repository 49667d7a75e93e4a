"""`bertrain evaluate`: fine-tune MODEL (and a baseline) on each task over seeds, record each (task, seed) in
DIR/results.json as it ends, skip those already there, and summarize. Under `bertrain launch` each process takes
every N-th run on its own device (runs are independent), and rank 0 prints the summary once all are in."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bertrain.config.finetune import finetune_config
from bertrain.data.task_batches import encode, pad_id
from bertrain.data.task_files import Examples
from bertrain.data.tasks import Task
from bertrain.errors import DataError
from bertrain.model import build_model
from bertrain.model.hf_classifier import load_pretrained
from bertrain.tokenizer_file import load_tokenizer
from bertrain.train.downstream_results import (BASELINE, MODEL, RESULTS_FILE, beyond_plan, check_continuation,
                                               check_fingerprints, find_run, read_results, record_run,
                                               refresh_summary, results_table, unchecked_runs)
from bertrain.train.finetune import TaskData, finetune
from bertrain.train.precision import local_device_type
from bertrain.train.signals import stop_requested
from bertrain.train.threads import plan_threads

POLL_SECONDS = 5.0
RANDOM_BASELINE = "random"  # --baseline random


def local_device() -> torch.device:
    """This process's device: the GPU of its local rank under a launcher, else the CPU."""
    kind = local_device_type()
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, int(os.environ.get("LOCAL_RANK", "0")))


def evaluate(model_path: Path, tasks: list[Task], out_dir: Path, console: Console, overrides: list[str] = (),
             seeds: int | None = None, baseline_path: Path | None = None, warn=print) -> dict:
    """Run every (model, task, seed) not yet in DIR/results.json; return the results (with their summary)."""
    threads = torch.get_num_threads()
    try:
        return _evaluate(model_path, tasks, out_dir, console, overrides, seeds, baseline_path, warn)
    finally:
        torch.set_num_threads(threads)  # finetune.threads is this evaluation's (in-process callers keep theirs)


def _evaluate(model_path: Path, tasks: list[Task], out_dir: Path, console: Console, overrides: list[str],
              seeds: int | None, baseline_path: Path | None, warn) -> dict:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    out_dir.mkdir(parents=True, exist_ok=True)
    recipes = {task.name: finetune_config(task.recipe, list(overrides), seeds) for task in tasks}
    plan = [{"task": task.name, "metrics": list(task.metrics), "seeds": recipes[task.name].seeds} for task in tasks]
    models = [(MODEL, model_path)] + ([(BASELINE, baseline_path)] if baseline_path is not None else [])
    device = local_device()
    results = read_results(out_dir)
    examples = {task.name: _examples(task, warn if rank == 0 else None) for task in tasks}
    data = {name: {split: {"examples": len(part), "sha256": part.sha256()}
                   for split, part in (("train", train), *validation.items())}
            for name, (train, validation) in examples.items()}
    if unchecked_runs(results) and rank == 0:
        warn(f"{out_dir / RESULTS_FILE} holds {unchecked_runs(results)} run(s) recorded without fingerprints of "
             "their examples and weights (by an older bertrain): they are continued without checking that the task "
             "files and the model are unchanged since. If either changed, use a new --out.")
    job = 0
    said_threads: list[int] = []  # finetune.threads: auto measures each run; a count is said when it changes

    def say_threads(line: str) -> None:
        if said_threads[-1:] != [torch.get_num_threads()]:
            said_threads.append(torch.get_num_threads())
            console.print(line, highlight=False)
    model_config = None  # MODEL's, listed first: the random baseline's architecture
    for key, path in models:
        skipped: list = []
        if str(path) == RANDOM_BASELINE:  # MODEL's architecture and tokenizer, fresh weights: what pretraining adds
            torch.manual_seed(0)
            pretrained = build_model(model_config)
            loaded = f"random weights ({pretrained.config.type}, as the model)"
        else:
            pretrained, tokenizer_dir, loaded = load_pretrained(path, skipped)
            model_config = model_config or pretrained.config
        for checkpoint, why in skipped:
            warn(f"Skipping invalid checkpoint {checkpoint}: {why}")
        weights = weights_sha256(pretrained)
        for task in tasks:
            recipe = recipes[task.name]
            check_continuation(results, out_dir, key, loaded, task.name, dataclasses.asdict(recipe))
            check_fingerprints(results, out_dir, key, loaded, weights, task.name, data[task.name], task.source)
        if rank == 0:
            console.print(f"[bold]{key}[/]: {loaded} ({pretrained.config.type}, {pretrained.num_parameters():,} "
                          f"parameters) on {device}", highlight=False)
        tokenizer = load_tokenizer(tokenizer_dir)
        for task in tasks:
            recipe = recipes[task.name]
            todo = []
            for seed in range(1, recipe.seeds + 1):  # run i of the plan is process i % world's, run or not
                if find_run(results, key, task.name, seed) is None and job % world == rank:
                    todo.append(seed)
                job += 1
            if not todo:
                continue
            max_length = min(recipe.max_seq_length, pretrained.config.max_position_embeddings)
            if max_length < recipe.max_seq_length and rank == 0:
                warn(f"{task.name}: finetune.max_seq_length {recipe.max_seq_length} exceeds the {key}'s "
                     f"max_position_embeddings {max_length}: its examples are truncated to {max_length} tokens.")
            encoded = _task_data(task, tokenizer, max_length, examples[task.name])
            threads = plan_threads(recipe.threads, device_type=device.type, world_size=world, deterministic=False,
                                   key="finetune.threads")
            for seed in todo:
                run = _run_one(pretrained, encoded, recipe, seed, device, console, f"{key} {task.name} seed {seed}",
                               threads, say_threads)
                run.update(model=key, task=task.name, seed=seed, recipe=dataclasses.asdict(recipe),
                           device=str(device), rank=rank, weights_sha256=weights, data=data[task.name])
                results = record_run(out_dir, key, loaded, run, plan)
                console.print(f"{key} {task.name} seed {seed}: "
                              + ", ".join(f"{name} {100 * value:.1f}" for name, value in run["scores"].items())
                              + f" ({run['train_examples_per_second']:.0f} examples/s)", highlight=False)
                if run["constant"]:
                    warn(f"{key} {task.name} seed {seed} gave every validation example one prediction "
                         f"({', '.join(run['constant'])}): a collapsed run, whose F1, MCC or correlation is "
                         f"undefined and counted as 0, widening the spread. A lower finetune.lr, more epochs or "
                         f"more training examples usually help.")
    if world > 1:
        results = _wait_for_all(out_dir, plan, [key for key, _ in models], console if rank == 0 else None)
    if rank == 0:
        results = refresh_summary(out_dir, plan)  # a smaller --seeds than results.json holds reports those asked
        for note in beyond_plan(results, plan, [key for key, _ in models]):
            console.print(note, highlight=False)
    if rank == 0 and results.get("summary"):
        console.print(results_table(results, f"bertrain evaluate: {out_dir} (scores x 100 over seeds)"))
        console.print(f"Wrote {out_dir / 'results.json'} and {out_dir / 'results.md'}.", highlight=False)
    return results


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's tensors as loaded (names, types, shapes, bytes), whatever file format they came from."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _examples(task: Task, warn) -> tuple[Examples, dict[str, Examples]]:
    """A task's examples, read once; `warn` about rows left out and about validation that is training data."""
    train, validation = task.load()
    if warn is None:
        return train, validation
    skipped = train.skipped + [line for split in validation.values() for line in split.skipped]
    if skipped:
        warn(f"{task.name}: left out {len(skipped)} malformed row(s), e.g. {skipped[0]}")
    seen = set(train.texts)
    for name, split in validation.items():
        train_file, file = task.files.get("train"), task.files.get(name)
        if train_file is not None and file is not None and file.resolve() == train_file.resolve():
            warn(f"{task.name}: its validation file {file} is its training file: the scores measure how well the "
                 "model recalls examples it was trained on, not how it does on new ones. Give a separate validation "
                 "file.")
        elif all(texts in seen for texts in split.texts):
            warn(f"{task.name}: all {len(split)} validation examples ({name}) are also in its training file: the "
                 "scores measure how well the model recalls examples it was trained on, not how it does on new ones.")
    return train, validation


def _task_data(task: Task, tokenizer, max_length: int, examples: tuple[Examples, dict[str, Examples]]) -> TaskData:
    """A task's examples encoded with this model's tokenizer, at most `max_length` tokens."""
    train, validation = examples
    regression = task.kind == "regression"
    if max(train.labels or [0]) >= task.num_labels and not regression:
        raise DataError(f"{task.name}: a label id is beyond the task's {task.num_labels} labels.")
    return TaskData(encode(tokenizer, train, max_length, regression),
                    {name: encode(tokenizer, split, max_length, regression)
                     for name, split in validation.items()},
                    task.metrics, task.num_labels, pad_id(tokenizer))


def _run_one(pretrained, data: TaskData, recipe, seed: int, device, console: Console, what: str, threads,
             say_threads) -> dict:
    """One fine-tuning run with a progress bar (steps, ETA); its record for results.json."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task(what, total=None)
        outcome = finetune(pretrained, data, recipe, seed, device,
                           on_step=lambda done, total: progress.update(bar, completed=done, total=total),
                           threads=threads, say=say_threads)
    return {"scores": outcome.scores, "score": outcome.score, "steps": outcome.steps,
            "train_seconds": round(outcome.train_seconds, 3), "eval_seconds": round(outcome.eval_seconds, 3),
            "train_examples_per_second": outcome.train_examples / max(outcome.train_seconds, 1e-9),
            "constant": outcome.constant, "threads": torch.get_num_threads()}  # auto's last choice: it changes rounding


def _wait_for_all(out_dir: Path, plan: list[dict], models: list[str], console: Console | None) -> dict:
    """Under a launcher: wait until every process's runs are in results.json (rank 0 then prints the summary)."""
    planned = [(model, item["task"], seed) for model in models for item in plan for seed in range(1, item["seeds"] + 1)]
    if console is not None:
        console.print("This process's runs are done; waiting for the other processes' runs.", highlight=False)
    while True:
        results = read_results(out_dir)
        if all(find_run(results, *run) is not None for run in planned) or stop_requested():
            return results
        time.sleep(POLL_SECONDS)

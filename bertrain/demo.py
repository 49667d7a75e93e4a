"""`bertrain demo`: the whole pipeline on CPython's documentation. Stages run as subprocesses of the real CLI,
so the demo runs what a user types and a crashed stage cannot leave this process half-initialized."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from bertrain import rundir
from bertrain.child_process import run_forwarding_signals
from bertrain.config import load_config, micro_batch_size_for
from bertrain.console import make_console
from bertrain.data.format import open_prepared
from bertrain.data.masking import IGNORE_INDEX
from bertrain.data.sources.pydoc import write_pydoc_corpus
from bertrain.errors import EXIT_REQUEUE, BertrainError, Interrupted, UsageError
from bertrain.model.fill_mask import fill_mask_words
from bertrain.special_tokens import MODEL_OF_KIND
from bertrain.tokenizer_file import token_strings
from bertrain.train.evaluate import validation_loader
from bertrain.train.monitor import read_metrics as read_run_metrics

MARKER = ".bertrain-demo"
STATE = ".bertrain-demo.json"  # what the demo in OUT was asked for and how far it got: lets a rerun resume
# CPython's reference writes keywords in quotes ('The "with" statement'), so the demo asks in that style.
FILL_MASK_SENTENCES = (
    'The "[MASK]" statement is used to define a function.',
    "An [MASK] is raised when a key is not found in a dictionary.",
    'The "[MASK]" statement is used to leave a loop.',
    "A dictionary maps keys to [MASK].",
)
# Python's statement keywords: a model of the reference manual should propose one for
# 'The "[MASK]" statement is used to define a function.' (`def`; `return`, `class`, `if` are near misses).
PYTHON_WORDS = frozenset({
    "assert", "pass", "del", "return", "yield", "raise", "break", "continue", "import", "from", "global",
    "nonlocal", "type", "if", "elif", "else", "while", "for", "try", "except", "finally", "with", "match",
    "case", "def", "class", "async", "await", "lambda", "print", "exec", "future"})

# The demo trains the shipped config demo_<model> on data with the tokenizer kind that model is shipped with.
TOKENIZER_OF_MODEL = {model: kind for kind, model in MODEL_OF_KIND.items()}
VOCAB_SIZE = 3000
QUICK_STEPS = 60
# Every paragraph of every topic (code too), in documents of ~3000 characters: topics range from 200
# bytes to 62 KB, and similar-sized documents keep the hash-based validation split near its fraction.
CORPUS_OPTIONS = {"prose_only": False, "max_chars": 3000}


@dataclass
class DemoResult:
    """What the demo measured; also written to OUT/summary.json."""

    model: str
    out: str
    quick: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    corpus: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    fill_mask: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)


def demo_recipe(corpus_dir: Path, model: str) -> dict[str, Any]:
    """The data recipe the demo prepares with (written to OUT/recipe.yaml for the user to read)."""
    # validation_fraction: ~10% of ~250 documents, a validation set of ~10k tokens
    return {"prepare": {"sources": [{"path": str(corpus_dir), "format": "text", "text_layout": "paragraphs"}],
                        "validation_fraction": 0.1, "num_shards": 2, "workers": 2, "dedup": True},
            "tokenizer": {"kind": TOKENIZER_OF_MODEL[model], "vocab_size": VOCAB_SIZE, "lowercase": True,
                          "strip_accents": True, "seed": 0}}


# --- Running the stages ---


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a stage gets, once, through the demo


def _stage_env() -> dict[str, str]:
    # The demo never needs the network; make sure nothing tries.
    defaults = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return dict(defaults, **os.environ)


def run_cli_stage(name: str, args: list[str], console: Console) -> None:
    """Run `python -m bertrain ARGS` with its output on our terminal; raise if it fails."""
    command = [sys.executable, "-m", "bertrain", *args]
    console.print(f"[dim]$ bertrain {' '.join(_quote(a) for a in args)}[/]", highlight=False)
    console.file.flush()
    # A stop signal reaches the stage once, through us: the stage decides (pretrain saves first), we wait for it.
    code = run_forwarding_signals(command, STOP_SIGNALS, env=_stage_env(),
                                  stdout=console.file if _is_real_file(console) else None)
    if code in (EXIT_REQUEUE, 130, 143, 129):  # its own requeue code, or killed by SIGINT/SIGTERM/SIGHUP
        raise Interrupted(f"The demo's {name} stage was stopped by a signal.", EXIT_REQUEUE if code == EXIT_REQUEUE
                          else 130)
    if code != 0:
        raise BertrainError(f"The demo's {name} stage failed (exit code {code}); its error is shown above. "
                            f"Command: {' '.join(_quote(c) for c in command)}")


def _is_real_file(console: Console) -> bool:
    try:
        console.file.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


def _quote(text: str) -> str:
    return f'"{text}"' if (" " in text or not text) else text


# --- Measuring learning ---


def learning_figures(run_dir: Path) -> dict[str, Any]:
    """First/last logged training loss and the last evaluation's metrics, from RUN_DIR/metrics.jsonl."""
    if not (run_dir / rundir.METRICS).is_file():  # the pretrain stage ran: its absence is an error here
        raise BertrainError(f"{run_dir / rundir.METRICS} does not exist: the pretrain stage wrote no metrics.")
    records = read_run_metrics(run_dir)
    train = [r for r in records if r.get("kind", "train") == "train" and r.get("loss") is not None]
    evals = [r for r in records if r.get("kind") == "eval"]
    figures: dict[str, Any] = {}
    if train:
        figures.update(first_step=train[0]["step"], first_loss=train[0]["loss"],
                       last_step=train[-1]["step"], last_loss=train[-1]["loss"],
                       train_mlm_accuracy=train[-1].get("mlm_accuracy"))
    if evals:
        last = evals[-1]
        figures.update(eval_step=last["step"], val_mlm_loss=last.get("mlm_loss"),
                       val_mlm_accuracy=last.get("mlm_accuracy"),
                       val_sentence_accuracy=last.get("sentence_accuracy"))
        if len(evals) > 1:
            figures["first_val_mlm_accuracy"] = evals[0].get("mlm_accuracy")
    return figures


def most_frequent_baseline(data_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Accuracy of always predicting the most frequent token at the validation masked positions."""
    config = load_config(run_dir / rundir.CONFIG)
    prepared = open_prepared(data_dir)
    micro_batch_size = micro_batch_size_for(config, world_size=1)
    loader = validation_loader(prepared, config.data, seed=config.train.seed, micro_batch_size=micro_batch_size,
                               rank=0, world_size=1)
    counts: Counter = Counter()
    for batch in loader:
        labels = batch["labels"]
        counts.update(labels[labels != IGNORE_INDEX].tolist())
    source = "validation masked positions"
    if not counts:  # no validation split: fall back to the training tokens' distribution
        special = set(prepared.special_tokens.values())
        for shard in prepared.split("train").shards:
            ids, freq = np.unique(np.asarray(shard.tokens), return_counts=True)
            counts.update({int(i): int(f) for i, f in zip(ids, freq) if int(i) not in special})
        source = "training tokens"
    token_id, top = counts.most_common(1)[0]
    token = token_strings(prepared.tokenizer_dir, prepared.vocab_size)[token_id]
    return {"baseline_accuracy": top / sum(counts.values()), "baseline_token": token,
            "baseline_positions": sum(counts.values()), "baseline_source": source}


# --- The demo ---


def prepare_out_dir(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Create OUT, or clear a previous demo's outputs in it (but `keep`); refuse to write into other directories."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file. Choose a directory (it is created if missing).")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise UsageError(f"--out {out} exists and was not written by `bertrain demo`; it is left alone. "
                         f"Choose a new or empty directory, e.g. --out {out}-demo.")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `bertrain demo`: running the same demo again resumes an interrupted run "
                              "here, another one replaces this directory's content\n")
    for name in ("corpus", "data", "run", "model", "recipe.yaml", "summary.json", STATE):
        target = out / name
        if name in keep:
            continue
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def resumable_step(out: Path, model: str, steps: Optional[int]) -> Optional[int]:
    """The step an interrupted demo in OUT with the same settings resumes from, or None to start over."""
    try:
        state = json.loads((out / STATE).read_text())
    except (OSError, ValueError):
        return None
    if state.get("model") != model or state.get("steps") != steps or "corpus" not in state \
            or not (out / "data" / "manifest.json").is_file():
        return None
    latest = rundir.find_latest_checkpoint(out / "run")
    return rundir.step_of(latest) if latest is not None else 0


def stop_advice(out: Path, model: str, steps: Optional[int], quick: bool) -> str:
    """What running the demo again does after it was stopped (resume or start over), with the command."""
    again = f"bertrain demo --out {_quote(str(out))}" + (f" --model {model}" if model != "albert" else "") + (
        " --quick" if quick else f" --steps {steps}" if steps is not None else "")
    step = resumable_step(out, model, steps)
    does = ("starts it over (the stop came before its data was prepared)" if step is None else
            "keeps the corpus and prepared data and trains from step 0 (no checkpoint yet)" if step == 0 else
            f"resumes training from step {step}, its newest checkpoint")
    return f"The demo was stopped. Running `{again}` again {does}."


def pretrain_overrides(steps: Optional[int], default_steps: int) -> list[str]:
    """--set overrides: a checkpoint every tenth of the run; with --steps N, 4 evaluations."""
    total = default_steps if steps is None else steps
    if total < 1:
        raise UsageError(f"--steps must be at least 1, got {total}.")
    overrides = [f"train.save_every={max(1, total // 10)}"]
    if steps is not None:
        evaluate = steps // 4 if steps >= 4 and steps % 4 == 0 else steps
        overrides += [f"train.max_steps={steps}", f"train.eval_every={evaluate}",
                      f"train.log_every={max(1, min(10, steps // 10))}"]
    return [item for override in overrides for item in ("--set", override)]


def run_demo(model: str = "albert", out: Path = Path("bertrain-demo"), steps: Optional[int] = None,
             quick: bool = False, console: Optional[Console] = None) -> DemoResult:
    """Run every stage (resuming an interrupted demo in OUT), print progress and a summary; return the figures."""
    console = console or make_console()
    if model not in TOKENIZER_OF_MODEL:
        raise UsageError(f"--model must be 'albert' or 'bert', got '{model}'.")
    if quick and steps is None:
        steps = QUICK_STEPS
    out = out.expanduser().resolve()
    try:
        return _run_stages(model, out, steps, quick, console)
    except (KeyboardInterrupt, Interrupted) as stop:
        raise Interrupted(stop_advice(out, model, steps, quick), getattr(stop, "exit_code", 130)) from None


def replaced_demo(out: Path) -> Optional[str]:
    """The earlier demo in OUT that a new one (other settings) replaces, in words, or None."""
    try:
        state = json.loads((out / STATE).read_text())
    except (OSError, ValueError):
        return None
    steps = f"{state['steps']} steps" if state.get("steps") else "default steps"
    return f"the {'' if (out / 'summary.json').is_file() else 'un'}finished {state.get('model', '?')} demo ({steps})"


def _run_stages(model: str, out: Path, steps: Optional[int], quick: bool, console: Console) -> DemoResult:
    resume_from = resumable_step(out, model, steps) if out.is_dir() and (out / MARKER).exists() else None
    earlier = replaced_demo(out) if resume_from is None and (out / MARKER).exists() else None
    if earlier:  # its run, checkpoints and model go: say so before they do
        console.print(f"Replacing {earlier} in {out} (pass --out DIR to keep both, e.g. --out {_quote(str(out))}-"
                      f"{model}).", highlight=False)
    prepare_out_dir(out, keep=("corpus", "data", "recipe.yaml", "run", STATE) if resume_from is not None else ())
    config_name = f"demo_{model}"
    paths = {"corpus": out / "corpus", "recipe": out / "recipe.yaml", "data": out / "data", "run": out / "run",
             "model": out / "model", "summary": out / "summary.json"}
    result = DemoResult(model=model, out=str(out), quick=quick, paths={k: str(v) for k, v in paths.items()})
    started = time.perf_counter()

    def stage(number: int, title: str) -> None:
        console.print(Rule(f"[bold]{number}/5 · {title}", align="left"))

    def timed(name: str, function, *args, **kwargs):
        begin = time.perf_counter()
        value = function(*args, **kwargs)
        result.seconds[name] = time.perf_counter() - begin
        return value

    if resume_from is not None:
        result.corpus = json.loads((out / STATE).read_text())["corpus"]
        console.print(f"Resuming the interrupted demo in {out}: corpus and prepared data kept, training goes on "
                      f"from step {resume_from}.", highlight=False)
    else:
        (out / STATE).write_text(json.dumps({"model": model, "steps": steps}))
        _corpus_and_data(model, paths, result, stage, timed, console)
        (out / STATE).write_text(json.dumps({"model": model, "steps": steps, "corpus": result.corpus}))

    stage(3, f"pretrain: a tiny {model.upper()} ({config_name}) on the CPU; step N / total and ETA below")
    default_steps = load_config(config_name).train.max_steps
    timed("pretrain", run_cli_stage, "pretrain",
          ["pretrain", "--config", config_name, "--data", str(paths["data"]), "--run-dir", str(paths["run"]),
           *pretrain_overrides(steps, default_steps)], console)

    stage(4, "export: Hugging Face format")
    timed("export", run_cli_stage, "export", ["export", str(paths["run"]), str(paths["model"])], console)

    stage(5, "fill-mask: the exported model fills in [MASK]")
    result.fill_mask = timed("fill-mask", fill_mask_words, paths["model"], FILL_MASK_SENTENCES)
    result.seconds["total"] = time.perf_counter() - started

    result.figures = learning_figures(paths["run"])
    result.figures.update(most_frequent_baseline(paths["data"], paths["run"]))
    result.checks = learning_checks(result)
    paths["summary"].write_text(json.dumps(result.__dict__, indent=2))
    print_summary(result, console)
    return result


def _corpus_and_data(model: str, paths: dict[str, Path], result: DemoResult, stage, timed, console: Console) -> None:
    """Stages 1 and 2: write the corpus and its recipe, prepare the data."""
    stage(1, "corpus: the English prose that ships with CPython (pydoc_data.topics)")
    result.corpus = timed("corpus", write_pydoc_corpus, paths["corpus"], **CORPUS_OPTIONS)
    paths["recipe"].write_text(
        "# Written by `bertrain demo`: prepare the CPython documentation with a small tokenizer.\n"
        + yaml.safe_dump(demo_recipe(paths["corpus"], model), sort_keys=False))
    console.print(f"{result.corpus['documents']} documents, {result.corpus['words']:,} words, "
                  f"{result.corpus['bytes'] / 1e3:.0f} KB → {paths['corpus']}", highlight=False)

    stage(2, f"prepare: train a {TOKENIZER_OF_MODEL[model]} tokenizer, tokenize into shards")
    timed("prepare", run_cli_stage, "prepare",
          ["prepare", "--recipe", str(paths["recipe"]), "--out", str(paths["data"])], console)


def learning_checks(result: DemoResult) -> dict[str, bool]:
    """The demo's evidence of learning, each a yes/no."""
    figures = result.figures
    checks = {}
    if figures.get("val_mlm_accuracy") is not None:
        checks["validation MLM accuracy above 1.5x the most-frequent-token baseline"] = (
            figures["val_mlm_accuracy"] > 1.5 * figures["baseline_accuracy"])
    if figures.get("first_loss") is not None:
        checks["training loss fell"] = figures["last_loss"] < figures["first_loss"]
    if result.fill_mask:
        predictions = [p["token"].lower() for p in result.fill_mask[0]["predictions"]]
        checks["a Python word among the top 5 for '" + result.fill_mask[0]["sentence"] + "'"] = any(
            word in PYTHON_WORDS for word in predictions)
    return checks


def _percent(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _number(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.3f}"


def _table(title: str, first: str, second: str, justify: str = "left") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first, style="cyan")
    table.add_column(second, justify=justify, style="green", overflow="fold")  # a long path shown whole, folded
    return table


def print_summary(result: DemoResult, console: Console) -> None:
    """The closing tables: time per stage, learning figures, fill-mask predictions, where things are."""
    console.print(Rule("[bold]demo summary", align="left"))
    times = _table("time per stage", "stage", "seconds", justify="right")
    for name, seconds in result.seconds.items():
        times.add_row(name, f"{seconds:.1f}", style="bold" if name == "total" else None)
    console.print(times)
    f = result.figures
    learning = _table("learning", "figure", "value", justify="right")
    learning.add_row(f"training loss, step {f.get('first_step', '—')} → {f.get('last_step', '—')}",
                     f"{_number(f.get('first_loss'))} → {_number(f.get('last_loss'))}")
    learning.add_row(f"validation MLM loss (step {f.get('eval_step', '—')})", _number(f.get("val_mlm_loss")))
    learning.add_row("validation MLM accuracy", _percent(f.get("val_mlm_accuracy")))
    token = f.get("baseline_token")
    shown = "▁, a bare word start" if token == "▁" else token
    learning.add_row(f"always predicting the most frequent token ('{shown}')", _percent(f.get("baseline_accuracy")))
    sentence_task = "SOP" if result.model == "albert" else "NSP"
    learning.add_row(f"validation {sentence_task} accuracy (chance 50%)", _percent(f.get("val_sentence_accuracy")))
    console.print(learning)
    predictions = _table("fill-mask: top 5 whole-word tokens", "sentence", "predictions")
    for item in result.fill_mask:
        predictions.add_row(item["sentence"],
                            ", ".join(f"{p['token']} ({p['score']:.2f})" for p in item["predictions"]))
    console.print(predictions)
    where = _table("where everything was written", "what", "path")
    labels = {"corpus": "corpus (.txt)", "recipe": "data recipe", "data": "prepared data (DATA_DIR)",
              "run": "run: checkpoints, metrics.jsonl, report.html (RUN_DIR)", "model": "Hugging Face model",
              "summary": "these figures (JSON)"}
    for key, label in labels.items():
        where.add_row(label, result.paths[key])
    console.print(where)
    for check, passed in result.checks.items():
        mark = "[green]✓[/]" if passed else "[yellow]✗[/]"
        console.print(f"{mark} {check}", highlight=False)
    if result.checks and not all(result.checks.values()):
        hint = ("--quick checks the pipeline, not the learning: run without it" if result.quick
                else "train longer with --steps N")
        console.print(f"[yellow]Some evidence of learning is missing: {hint}.[/]")
    model = result.paths["model"]
    console.print(f"\nNext: load it with transformers — AutoModelForMaskedLM.from_pretrained('{model}') — or try "
                  f"`bertrain fill-mask {model} \"Your [MASK] sentence.\"`.", highlight=False)

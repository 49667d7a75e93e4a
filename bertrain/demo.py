"""`bertrain demo`: the whole pipeline on CPython's own documentation, on a CPU, in minutes.

Stages run as subprocesses of the real CLI (`python -m bertrain prepare|pretrain|export`), so the
demo exercises exactly what a user types, each stage shows its own progress, and a crash in one
stage cannot leave the demo's process in a half-initialized state. Fill-mask reads the exported
Hugging Face directory back through bertrain's importer; the tests load it with `transformers`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from bertrain.errors import EXIT_REQUEUE, BertrainError, Interrupted, UsageError

MARKER = ".bertrain-demo"
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

# Per model kind: the shipped config the demo trains and the tokenizer it prepares.
MODELS = {
    "albert": {"config": "demo_albert", "tokenizer": {"kind": "unigram", "vocab_size": 3000}},
    "bert": {"config": "demo_bert", "tokenizer": {"kind": "wordpiece", "vocab_size": 3000}},
}
QUICK_STEPS = 60


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


# ----------------------------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------------------------


def pydoc_documents(max_chars: int = 3000) -> list[tuple[str, str]]:
    """(name, text) documents from pydoc_data.topics: consecutive paragraphs of one topic, ~max_chars each.

    Topics range from 200 bytes to 62 KB; cutting them into similar-sized documents keeps the
    hash-based validation split close to its nominal fraction instead of one huge topic deciding it.
    """
    from pydoc_data.topics import topics

    documents = []
    for key in sorted(topics):
        paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", topics[key]) if p.strip()]
        chunk: list[str] = []
        size = 0
        for paragraph in paragraphs:
            chunk.append(paragraph)
            size += len(paragraph)
            if size >= max_chars:
                documents.append((f"{key}-{len(documents):04d}", "\n\n".join(chunk)))
                chunk, size = [], 0
        if chunk:
            documents.append((f"{key}-{len(documents):04d}", "\n\n".join(chunk)))
    return documents


def write_demo_corpus(out_dir: Path) -> dict[str, Any]:
    """Write one .txt file per document (paragraph layout) and return counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    documents = pydoc_documents()
    total = 0
    for name, text in documents:
        safe = re.sub(r"[^A-Za-z0-9_-]+", "_", name)
        data = (text + "\n").encode("utf-8")
        (out_dir / f"{safe}.txt").write_bytes(data)
        total += len(data)
    words = sum(len(text.split()) for _, text in documents)
    return {"documents": len(documents), "bytes": total, "words": words}


def demo_recipe(corpus_dir: Path, model: str) -> dict[str, Any]:
    """The data recipe the demo prepares with (written to OUT/recipe.yaml for the user to read)."""
    return {
        "prepare": {
            "sources": [{"path": str(corpus_dir), "format": "text", "text_layout": "paragraphs"}],
            "validation_fraction": 0.1,   # ~10% of ~250 documents: a validation set of ~10k tokens
            "num_shards": 2,
            "workers": 2,
            "dedup": True,
        },
        "tokenizer": dict(MODELS[model]["tokenizer"], lowercase=True, seed=0),
    }


# ----------------------------------------------------------------------------------------------
# Running the stages
# ----------------------------------------------------------------------------------------------


def _stage_env() -> dict[str, str]:
    env = dict(os.environ)
    # The demo never needs the network; make sure nothing tries.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.setdefault(name, "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_cli_stage(name: str, args: list[str], console: Console) -> None:
    """Run `python -m bertrain ARGS` with its output on our terminal; raise if it fails."""
    command = [sys.executable, "-m", "bertrain", *args]
    console.print(f"[dim]$ bertrain {' '.join(_quote(a) for a in args)}[/]", highlight=False)
    console.file.flush()
    result = subprocess.run(command, env=_stage_env(), stdout=console.file if _is_real_file(console) else None)
    if result.returncode == EXIT_REQUEUE:
        raise Interrupted(f"The demo's {name} stage was stopped by a signal. Run `bertrain demo` again.")
    if result.returncode != 0:
        raise BertrainError(f"The demo's {name} stage failed (exit code {result.returncode}); its error is shown "
                            f"above. Command: {' '.join(_quote(c) for c in command)}")


def _is_real_file(console: Console) -> bool:
    try:
        console.file.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


def _quote(text: str) -> str:
    return f'"{text}"' if (" " in text or not text) else text


# ----------------------------------------------------------------------------------------------
# Measuring learning
# ----------------------------------------------------------------------------------------------


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """RUN_DIR/metrics.jsonl's records; its absence is an error here (the pretrain stage ran)."""
    from bertrain.train.monitor import METRICS_FILE, read_metrics as read_run_metrics

    if not (run_dir / METRICS_FILE).is_file():
        raise BertrainError(f"{run_dir / METRICS_FILE} does not exist: the pretrain stage wrote no metrics.")
    return read_run_metrics(run_dir)


def learning_figures(run_dir: Path) -> dict[str, Any]:
    """First/last logged training loss and the last evaluation's metrics, from RUN_DIR/metrics.jsonl."""
    records = read_metrics(run_dir)
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
    """Accuracy of always predicting the most frequent token, at the validation split's masked positions.

    Uses the same validation batches (fixed masks) as the trainer's evaluation, so it is the exact
    score of the constant predictor that the model's validation MLM accuracy is compared with.
    """
    from bertrain.config import load_config
    from bertrain.data.format import open_prepared
    from bertrain.data.loader import build_validation_loader
    from bertrain.train.loop import micro_batch_size_for

    config = load_config(run_dir / "config.yaml")
    prepared = open_prepared(data_dir)
    micro_batch_size = micro_batch_size_for(config, world_size=1)
    loader = build_validation_loader(prepared, config.data, seed=config.train.seed, micro_batch_size=micro_batch_size,
                                     rank=0, world_size=1, max_batches=config.data.eval_batches)
    counts: Counter = Counter()
    for batch in loader:
        labels = batch["labels"]
        counts.update(labels[labels != -100].tolist())
    source = "validation masked positions"
    if not counts:  # no validation split: fall back to the training tokens' distribution
        import numpy as np

        special = set(prepared.special_tokens.values())
        for shard in prepared.split("train").shards:
            ids, freq = np.unique(np.asarray(shard.tokens), return_counts=True)
            counts.update({int(i): int(f) for i, f in zip(ids, freq) if int(i) not in special})
        source = "training tokens"
    token_id, top = counts.most_common(1)[0]
    token = _token_string(prepared.tokenizer_dir, token_id)
    return {"baseline_accuracy": top / sum(counts.values()), "baseline_token": token,
            "baseline_positions": sum(counts.values()), "baseline_source": source}


def _token_string(tokenizer_dir: Path, token_id: int) -> str:
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).id_to_token(token_id) or str(token_id)
    except Exception:  # the figure matters, not the label
        return str(token_id)


def fill_mask(model_dir: Path, sentences: tuple[str, ...], top_k: int = 5) -> list[dict[str, Any]]:
    """Top-k whole-word predictions for the [MASK] of each sentence, from the exported directory read
    back through bertrain's Hugging Face importer (transformers is not needed at run time)."""
    import torch

    from bertrain.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
    from bertrain.model.hf import load_for_inference

    model, tokenizer_dir = load_for_inference(model_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    vocabulary = [tokenizer.id_to_token(i) or "" for i in range(model.config.vocab_size)]
    mask_id = tokenizer.token_to_id("[MASK]")
    specials = {token for kind in SPECIAL_TOKENS.values() for token in kind.values()}
    special_ids = {i for i, token in enumerate(vocabulary) if token in specials}
    is_word = torch.tensor(whole_word_tokens(vocabulary, special_ids))
    results = []
    for sentence in sentences:
        encoding = tokenizer.encode(sentence)
        positions = [i for i, token_id in enumerate(encoding.ids) if token_id == mask_id]
        if len(positions) != 1:
            raise BertrainError(f"Fill-mask: '{sentence}' has {len(positions)} mask tokens after tokenizing; "
                                f"the exported tokenizer does not keep [MASK] whole.")
        input_ids = torch.tensor([encoding.ids])
        with torch.no_grad():
            logits = model(input_ids, torch.ones_like(input_ids), torch.tensor([encoding.type_ids])).mlm_logits
        # The mask stands for a word: rank only tokens that can be one (not "▁" alone, "##ing", "s").
        top = logits[0, positions[0]].softmax(-1).masked_fill(~is_word, 0.0).topk(top_k)
        words = [_clean_piece(vocabulary[int(i)]) for i in top.indices]
        results.append({"sentence": sentence, "predictions": [
            {"token": word, "score": round(float(p), 4)} for word, p in zip(words, top.values)]})
    return results


def whole_word_tokens(vocabulary: list[str], special_ids: set[int]) -> list[bool]:
    """Which tokens can stand for a whole word: not special, not a WordPiece "##" continuation, and at
    least two characters without the Unigram word marker (so not "▁" alone, "s", "." or '"')."""
    return [i not in special_ids and not token.startswith("##") and len(token.removeprefix("▁")) > 1
            for i, token in enumerate(vocabulary)]


def _clean_piece(piece: str) -> str:
    return piece.removeprefix("▁").removeprefix("##") or piece


# ----------------------------------------------------------------------------------------------
# The demo
# ----------------------------------------------------------------------------------------------


def prepare_out_dir(out: Path) -> None:
    """Create OUT, or clear a previous demo's outputs in it; refuse to write into other directories."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file. Choose a directory (it is created if missing).")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise UsageError(f"--out {out} exists and was not written by `bertrain demo`; it is left alone. "
                         f"Choose a new or empty directory, e.g. --out {out}-demo.")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `bertrain demo`; running the demo again replaces this directory's content\n")
    for name in ("corpus", "data", "run", "model", "recipe.yaml", "summary.json"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def pretrain_overrides(steps: Optional[int]) -> list[str]:
    """--set overrides for a shorter run: evaluate 4 times and checkpoint only at the end."""
    if steps is None:
        return []
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}.")
    evaluate = steps // 4 if steps >= 4 and steps % 4 == 0 else steps
    overrides = [f"train.max_steps={steps}", f"train.eval_every={evaluate}", f"train.save_every={steps}",
                 f"train.log_every={max(1, min(10, steps // 10))}"]
    return [item for override in overrides for item in ("--set", override)]


def run_demo(model: str = "albert", out: Path = Path("bertrain-demo"), steps: Optional[int] = None,
             quick: bool = False, console: Optional[Console] = None) -> DemoResult:
    """Run every stage and return the figures; prints progress and a closing summary to `console`."""
    console = console or Console()
    if model not in MODELS:
        raise UsageError(f"--model must be 'albert' or 'bert', got '{model}'.")
    if quick and steps is None:
        steps = QUICK_STEPS
    out = out.expanduser().resolve()
    prepare_out_dir(out)
    config_name = MODELS[model]["config"]
    paths = {"corpus": out / "corpus", "recipe": out / "recipe.yaml", "data": out / "data", "run": out / "run",
             "model": out / "model", "summary": out / "summary.json"}
    result = DemoResult(model=model, out=str(out), quick=quick, paths={k: str(v) for k, v in paths.items()})
    started = time.perf_counter()

    def stage(number: int, title: str) -> None:
        console.print(Rule(f"[bold]{number}/5 · {title}", align="left"))

    def timed(name: str, function, *args):
        begin = time.perf_counter()
        value = function(*args)
        result.seconds[name] = time.perf_counter() - begin
        return value

    stage(1, "corpus: the English prose that ships with CPython (pydoc_data.topics)")
    result.corpus = timed("corpus", write_demo_corpus, paths["corpus"])
    paths["recipe"].write_text(
        "# Written by `bertrain demo`: prepare the CPython documentation with a small tokenizer.\n"
        + yaml.safe_dump(demo_recipe(paths["corpus"], model), sort_keys=False))
    console.print(f"{result.corpus['documents']} documents, {result.corpus['words']:,} words, "
                  f"{result.corpus['bytes'] / 1e3:.0f} KB → {paths['corpus']}", highlight=False)

    stage(2, f"prepare: train a {MODELS[model]['tokenizer']['kind']} tokenizer, tokenize into shards")
    timed("prepare", run_cli_stage, "prepare",
          ["prepare", "--recipe", str(paths["recipe"]), "--out", str(paths["data"])], console)

    stage(3, f"pretrain: a tiny {model.upper()} ({config_name}) on the CPU")
    timed("pretrain", run_cli_stage, "pretrain",
          ["pretrain", "--config", config_name, "--data", str(paths["data"]), "--run-dir", str(paths["run"]),
           *pretrain_overrides(steps)], console)

    stage(4, "export: Hugging Face format")
    timed("export", run_cli_stage, "export", ["export", str(paths["run"]), str(paths["model"])], console)

    stage(5, "fill-mask: the exported model fills in [MASK]")
    result.fill_mask = timed("fill-mask", fill_mask, paths["model"], FILL_MASK_SENTENCES)
    result.seconds["total"] = time.perf_counter() - started

    result.figures = learning_figures(paths["run"])
    result.figures.update(most_frequent_baseline(paths["data"], paths["run"]))
    result.checks = learning_checks(result)
    paths["summary"].write_text(json.dumps(result.__dict__, indent=2))
    print_summary(result, console)
    return result


def learning_checks(result: DemoResult) -> dict[str, bool]:
    """The demo's evidence of learning, each a yes/no."""
    figures = result.figures
    checks = {}
    if figures.get("val_mlm_accuracy") is not None:
        checks["validation MLM accuracy above the most-frequent-token baseline"] = (
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


def print_summary(result: DemoResult, console: Console) -> None:
    """The closing tables: time per stage, learning figures, fill-mask predictions, where things are."""
    console.print(Rule("[bold]demo summary", align="left"))
    times = Table(title="time per stage", title_justify="left")
    times.add_column("stage", style="cyan")
    times.add_column("seconds", justify="right", style="green")
    for name, seconds in result.seconds.items():
        times.add_row(name, f"{seconds:.1f}", style="bold" if name == "total" else None)
    console.print(times)

    f = result.figures
    learning = Table(title="learning", title_justify="left")
    learning.add_column("figure", style="cyan")
    learning.add_column("value", justify="right", style="green")
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

    predictions = Table(title="fill-mask: top 5 whole-word tokens", title_justify="left")
    predictions.add_column("sentence", style="cyan")
    predictions.add_column("predictions", style="green")
    for item in result.fill_mask:
        predictions.add_row(item["sentence"], ", ".join(f"{p['token']} ({p['score']:.2f})" for p in item["predictions"]))
    console.print(predictions)

    where = Table(title="where everything was written", title_justify="left")
    where.add_column("what", style="cyan")
    where.add_column("path")
    labels = {"corpus": "corpus (.txt)", "recipe": "data recipe", "data": "prepared data (DATA_DIR)",
              "run": "run: checkpoints, metrics.jsonl (RUN_DIR)", "model": "Hugging Face model",
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
    console.print(f"\nNext: load it with transformers — AutoModelForMaskedLM.from_pretrained('{result.paths['model']}') "
                  f"— or try `bertrain fill-mask {result.paths['model']} \"Your [MASK] sentence.\"`.", highlight=False)

"""`bertrain evaluate`'s fine-tuning against transformers' Trainer on the same pretrained weights, task, recipe
and seeds. Not part of the test suite.

1. Scores: a tiny BERT pretrained here (bertrain prepare + pretrain on a generated corpus, then exported) is
   fine-tuned on the word-kind task of tests/test_evaluate.py (validation words never seen in fine-tuning) by both,
   over the same seeds: median, mean ± std, and whether the medians differ by more than the seed spread.
2. Speed: training examples/s of both on a generated sentence-pair task (lengths 12-128 tokens, batch 32,
   1 epoch) with a BERT of hidden 256, 4 layers (random weights: speed does not depend on them).
   Trainer gets DataCollatorWithPadding (dynamic padding, as ours) and its default fused AdamW.
Both run in this process, alternately, with the same torch threads.

    python benchmarks/evaluate_vs_trainer.py
    python benchmarks/evaluate_vs_trainer.py --seeds 5 --threads 2
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bertrain.config import ModelConfig  # noqa: E402
from bertrain.config.finetune import finetune_config  # noqa: E402
from bertrain.console import make_console  # noqa: E402
from bertrain.data.task_files import Examples  # noqa: E402
from bertrain.data.tasks import resolve_tasks  # noqa: E402
from bertrain.model import build_model  # noqa: E402
from bertrain.model.hf import export_hf  # noqa: E402
from bertrain.train.downstream import evaluate  # noqa: E402
from bertrain.train.finetune import finetune, total_steps  # noqa: E402
from bertrain.train.scores import score  # noqa: E402
from tests.helpers import pretrain_env  # noqa: E402
from tests.test_evaluate import pretrain_word_kind_model  # noqa: E402


def bertrain_cli(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "bertrain", *args], env=pretrain_env(), capture_output=True,
                            text=True)
    if result.returncode:
        sys.exit(f"bertrain {args[0]} failed:\n{result.stderr[-2000:]}")


def pretrained_model(work: Path, steps: int) -> tuple[Path, Path]:
    """(exported pretrained tiny BERT, word-kind task file)."""
    run_dir, task = pretrain_word_kind_model(work, steps)
    bertrain_cli("export", str(run_dir), str(work / "export"))
    return work / "export", task


def trainer_run(model_dir: Path, train: Examples, dev: Examples, recipe, seed: int, out: Path
                ) -> tuple[float, float]:
    """(accuracy, training examples/s) of transformers' Trainer with the recipe."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)

    def dataset(examples: Examples) -> datasets.Dataset:
        columns = list(zip(*examples.texts))
        encoded = tokenizer(*columns, truncation=True, max_length=recipe.max_seq_length)
        return datasets.Dataset.from_dict({**encoded, "labels": examples.labels})

    train_set, dev_set = dataset(train), dataset(dev)
    steps = total_steps(len(train), recipe)
    args = transformers.TrainingArguments(
        output_dir=str(out), learning_rate=recipe.lr, per_device_train_batch_size=recipe.batch_size,
        per_device_eval_batch_size=recipe.eval_batch_size, num_train_epochs=recipe.epochs,
        warmup_steps=int(round(recipe.warmup_fraction * steps)), weight_decay=recipe.weight_decay,
        max_grad_norm=recipe.max_grad_norm, lr_scheduler_type="linear", seed=seed, save_strategy="no",
        logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train_set,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logits = trainer.predict(dev_set).predictions
    examples_seen = min(steps * recipe.batch_size, int(np.ceil(recipe.epochs * len(train))))
    return score("accuracy", np.asarray(logits), np.asarray(dev.labels)), examples_seen / seconds


def spread_line(name: str, values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return (f"{name:<12} median {100 * statistics.median(values):5.1f}  mean {100 * statistics.mean(values):5.1f} "
            f"± {100 * std:4.1f}  ({', '.join(f'{100 * v:.1f}' for v in values)})")


def scores_part(work: Path, args) -> None:
    model_dir, task_file = pretrained_model(work, args.pretrain_steps)
    (task,) = resolve_tasks(str(task_file), None)
    recipe = finetune_config(task.recipe, [], args.seeds)
    train, validation = task.load()
    results = evaluate(model_dir, [task], work / "ours", make_console(file=io.StringIO()), [], args.seeds)
    ours = results["summary"]["model"]["tasks"]["word_kind"]["scores"]
    theirs = [trainer_run(model_dir, train, validation["dev"], recipe, seed, work / "trainer")[0]
              for seed in range(1, args.seeds + 1)]
    print(f"\n1. Scores on word_kind ({len(train)} train / {len(validation['dev'])} validation examples; lr "
          f"{recipe.lr}, batch {recipe.batch_size}, {recipe.epochs:g} epochs, warmup {recipe.warmup_fraction:.0%}), "
          f"accuracy x 100 over seeds 1..{args.seeds}:")
    print(spread_line("bertrain", ours))
    print(spread_line("Trainer", theirs))
    difference = statistics.median(ours) - statistics.median(theirs)
    spread = max(statistics.stdev(ours), statistics.stdev(theirs)) if args.seeds > 1 else 0.0
    print(f"difference of medians {100 * difference:+.1f}, seed spread (larger std) {100 * spread:.1f}: "
          f"{'within' if abs(difference) <= spread else 'BEYOND'} the spread")


def pair_task(tokenizer_words: list[str], count: int, seed: int) -> Examples:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(count):
        a, b = (" ".join(rng.choice(tokenizer_words, rng.integers(5, 60))) for _ in range(2))
        texts.append((a, b))
        labels.append(int(rng.integers(0, 2)))
    return Examples(texts, labels)


def speed_part(work: Path, args) -> None:
    from bertrain.data.task_batches import encode, pad_id
    from bertrain.tokenizer_file import load_tokenizer
    from bertrain.train.finetune import TaskData

    tokenizer_dir = work / "data" / "tokenizer"
    tokenizer = load_tokenizer(tokenizer_dir)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2]
    config = ModelConfig(type="bert", vocab_size=tokenizer.get_vocab_size(), hidden_size=256, num_hidden_layers=4,
                         num_attention_heads=4, intermediate_size=1024, max_position_embeddings=128)
    torch.manual_seed(0)
    model = build_model(config)
    export_hf(model, work / "speed_model", tokenizer_dir=tokenizer_dir)
    train, dev = pair_task(words, args.speed_examples, 0), pair_task(words, 64, 1)
    recipe = finetune_config({"epochs": 1}, [], 1)
    data = TaskData(encode(tokenizer, train, recipe.max_seq_length, False),
                    {"dev": encode(tokenizer, dev, recipe.max_seq_length, False)}, ("accuracy",), 2, pad_id(tokenizer))
    tokens = int(data.train.lengths.sum())
    ours, theirs = [], []
    for round_ in range(args.rounds):
        outcome = finetune(model, data, recipe, seed=1, device=torch.device("cpu"))
        ours.append(outcome.train_examples / outcome.train_seconds)
        theirs.append(trainer_run(work / "speed_model", train, dev, recipe, 1, work / "trainer_speed")[1])
    print(f"\n2. Training speed: BERT H=256 L=4 ({model.num_parameters() / 1e6:.1f}M parameters), {len(train)} pairs "
          f"({tokens / len(train):.0f} tokens on average, max 128), batch {recipe.batch_size}, 1 epoch, "
          f"{torch.get_num_threads()} thread(s), median of {args.rounds}:")
    print(f"bertrain     {statistics.median(ours):8.1f} examples/s  ({', '.join(f'{v:.1f}' for v in ours)})")
    print(f"Trainer      {statistics.median(theirs):8.1f} examples/s  ({', '.join(f'{v:.1f}' for v in theirs)})")
    print(f"speed-up     {statistics.median(ours) / statistics.median(theirs):8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--speed-examples", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--only", default="scores,speed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "scores" in args.only:
            scores_part(work, args)
        elif "speed" in args.only:
            pretrained_model(work, 1)  # the speed part needs the tokenizer only
        if "speed" in args.only:
            speed_part(work, args)


if __name__ == "__main__":
    main()

"""The training loop's per-step bookkeeping against the bare step, in one process, alternated.

    python benchmarks/loop_overhead.py                     # tiny_bert's shape on the pydoc recipe's data
    python benchmarks/loop_overhead.py --data DATA_DIR --rounds 7 --steps 20
    python benchmarks/loop_overhead.py --config bert_large --set model.hidden_size=16 \
        --set model.num_attention_heads=1 --set model.intermediate_size=16 --set train.batch_size=2 \
        --set data.max_seq_length=16   # bert_large's layers at a width where the step is nearly all host time

bare: model(**batch).loss.backward(); optimizer.step(); zero_grad — nothing else.
loop: what Trainer does per step: train_step (globally normalized losses, metric sums on the device,
gradient clipping, the finiteness flag), optimizer_step (skip through found_inf), the non-finite
watch, the scheduler, and every `log_every` steps the one host read of the metrics.
Both run on the same batches (with the collator's BatchLayout, as in training), order reversed
every round; the overhead is the median over rounds of loop time / bare time - 1. Not part of the suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertrain.config import DataConfig, ModelConfig, OptimConfig, load_config
from bertrain.data.format import open_prepared
from bertrain.data.loader import build_train_loader
from bertrain.model import build_model
from bertrain.train.optim import build_optimizer, build_scheduler
from bertrain.train.step import NonFiniteWatch, optimizer_step, train_step

from unpad import prepared_pydoc  # benchmarks/unpad.py: the pydoc DATA_DIR cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/
from tests.helpers import OneProcess  # noqa: E402  (one stand-in Accelerator for test and benchmark)


def bare_step(model, optimizer):
    def step(batch: dict) -> None:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def loop_step(model, optimizer, optim_config: OptimConfig, log_every: int):
    scheduler = build_scheduler(optimizer, optim_config, 10 ** 6)
    watch, accelerator, state = NonFiniteWatch(), OneProcess(), {"step": 0, "tokens": 0}

    def step(batch: dict) -> None:
        result = train_step(model, accelerator, [batch], optim_config.max_grad_norm)
        state["tokens"] += result.tokens
        optimizer_step(optimizer, result, None)
        watch.add(result.finite)
        scheduler.step()
        state["step"] += 1
        if state["step"] % log_every == 0:
            watch.read()
            result.read(accelerator)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="Prepared DATA_DIR (default: prepare the pydoc recipe in a cache dir).")
    parser.add_argument("--config", default="tiny_bert", help="Shipped config name or YAML (its model and batch).")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="A config override.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="Steps per round and variant.")
    args = parser.parse_args()

    data = Path(args.data) if args.data else prepared_pydoc(Path(tempfile.gettempdir()) / "bertrain-bench-pydoc")
    prepared = open_prepared(data)
    config = load_config(args.config, args.set)
    model_config = ModelConfig(**{**vars(config.model), "vocab_size": prepared.vocab_size, "init_from": None})
    data_config = DataConfig(objective=config.data.objective, max_seq_length=config.data.max_seq_length)
    loader = build_train_loader(prepared, data_config, seed=0, epoch=0, micro_batch_size=config.train.batch_size,
                                rank=0, world_size=1)
    batches = [loader.dataset[i % len(loader.dataset)] for i in range(args.steps)]
    variants = {}
    for name, make in (("bare", lambda m, o: bare_step(m, o)),
                       ("loop", lambda m, o: loop_step(m, o, config.optim, config.train.log_every))):
        torch.manual_seed(0)
        model = build_model(model_config).train()
        variants[name] = make(model, build_optimizer(model, config.optim, torch.device("cpu")))
    for fn in variants.values():  # warm up
        for batch in batches[:3]:
            fn(batch)
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for r in range(args.rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            for batch in batches:
                fn(batch)
            times[name].append(time.perf_counter() - start)
    ratios = [loop / bare for loop, bare in zip(times["loop"], times["bare"])]
    bare_ms = statistics.median(times["bare"]) / args.steps * 1e3
    loop_ms = statistics.median(times["loop"]) / args.steps * 1e3
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.config} "
          f"(H {model_config.hidden_size}, batch {config.train.batch_size}, seq {data_config.max_seq_length}), "
          f"{args.rounds} alternated rounds of {args.steps} steps")
    print(f"bare step {bare_ms:.1f} ms, loop step {loop_ms:.1f} ms, overhead median "
          f"{statistics.median(ratios) - 1:+.1%} (rounds: {', '.join(f'{x - 1:+.1%}' for x in ratios)})")


if __name__ == "__main__":
    main()

"""Training-step throughput in REAL tokens/s: the unpadded (packed) encoder path against the padded
forward, on NSP micro-batches of a real prepared corpus (the pydoc recipe), in one process, runs
alternated (order reversed every round) on the same batches, medians reported. Not part of the suite.

    python benchmarks/unpad.py                                   # prepares the pydoc corpus in a cache dir
    python benchmarks/unpad.py --data data/pydoc --shapes bert-base --rounds 3

A step is forward, backward and AdamW(fused), on batches carrying the collator's BatchLayout as in training. "pad" is the share of padding in the
timed padded batches (what the unpadded path does not compute).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertrain.config import DataConfig, ModelConfig
from bertrain.data.sources.pydoc import write_pydoc_corpus
from bertrain.data.format import open_prepared
from bertrain.data.loader import build_train_loader
from bertrain.model import build_model
from bertrain.model.layout import batch_layout

SHAPES = {  # name: (hidden, layers, heads, intermediate, {seq: micro-batch})
    "tiny": (128, 2, 2, 512, {128: 32, 512: 8}),
    "small": (256, 4, 4, 1024, {128: 16, 512: 4}),
    "bert-base": (768, 12, 12, 3072, {128: 8, 512: 4}),
}


def prepared_pydoc(cache: Path) -> Path:
    """A pydoc DATA_DIR (written once into `cache` with `bertrain prepare --recipe pydoc`)."""
    data = cache / "data"
    if not (data / "manifest.json").exists():
        write_pydoc_corpus(str(cache / "pydoc_corpus"))
        subprocess.run([sys.executable, "-m", "bertrain", "prepare", "--recipe", "pydoc", "--source",
                        str(cache / "pydoc_corpus"), "--out", str(data)], check=True, stdout=subprocess.DEVNULL)
    return data


def sample_batches(data: Path, seq: int, micro_batch: int, count: int) -> list[dict]:
    """`count` training micro-batches of the NSP plan at this length, spread over the epoch."""
    loader = build_train_loader(open_prepared(data), DataConfig(objective="nsp", max_seq_length=seq), seed=0,
                                epoch=0, micro_batch_size=micro_batch, rank=0, world_size=1, layout=batch_layout)
    stride = max(len(loader.dataset) // count, 1)
    return [loader.dataset[i * stride] for i in range(min(count, len(loader.dataset)))]


def step_fn(model, batches: list[dict], unpadded: bool):
    """One training step per call, cycling through the batches; returns the real tokens it processed."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    state = {"next": 0}

    def step() -> int:
        batch = batches[state["next"] % len(batches)]
        state["next"] += 1
        optimizer.zero_grad(set_to_none=True)
        model.unpad = "true" if unpadded else "false"  # what model.unpad selects; the layout as in training
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        return int(batch["attention_mask"].sum())

    return step


def alternate(steps: dict, rounds: int, per_round: int) -> dict[str, float]:
    """Median real tokens/s of each step function, alternated (order reversed every round)."""
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():  # warm up
        fn()
    order = list(steps.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            start, tokens = time.perf_counter(), 0
            for _ in range(per_round):
                tokens += fn()
            rates[name].append(tokens / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="Prepared DATA_DIR (default: prepare the pydoc recipe in a cache dir).")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8, help="Micro-batches sampled across the epoch.")
    parser.add_argument("--hidden-dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    args = parser.parse_args()

    data = Path(args.data) if args.data else prepared_pydoc(Path(tempfile.gettempdir()) / "bertrain-bench-pydoc")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, data {data}, NSP, hidden dropout "
          f"{args.hidden_dropout}, attention dropout {args.attention_dropout}, AdamW(fused), medians of "
          f"{args.rounds} alternated rounds")
    print(f"{'shape':<10} {'seq':>4} {'batch':>5} {'pad':>5} {'padded tok/s':>12} {'unpadded tok/s':>14} {'ratio':>6}")
    for seq in (int(s) for s in args.seqs.split(",")):
        for name in args.shapes.split(","):
            H, L, heads, inter, micro = SHAPES[name]
            config = ModelConfig(type="bert", vocab_size=30522, hidden_size=H, num_hidden_layers=L,
                                 num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=512,
                                 hidden_dropout_prob=args.hidden_dropout,
                                 attention_probs_dropout_prob=args.attention_dropout)
            torch.manual_seed(0)
            model = build_model(config).train()
            batches = sample_batches(data, seq, micro[seq], count=args.batches)
            per_round = 1 if H >= 768 else 4
            timed = [batches[i % len(batches)] for i in range(1, 1 + args.rounds * per_round)]  # after warm-up
            real = sum(int(b["attention_mask"].sum()) for b in timed)
            padded_tokens = sum(b["attention_mask"].numel() for b in timed)
            rates = alternate({"padded": step_fn(model, batches, False), "unpadded": step_fn(model, batches, True)},
                              args.rounds, per_round)
            print(f"{name:<10} {seq:>4} {micro[seq]:>5} {1 - real / padded_tokens:>5.0%} {rates['padded']:>12.0f} "
                  f"{rates['unpadded']:>14.0f} {rates['unpadded'] / rates['padded']:>5.2f}x", flush=True)
            del model


if __name__ == "__main__":
    main()

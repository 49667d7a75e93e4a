"""Training-step throughput in REAL tokens/s: the unpadded (packed) encoder path against the padded
forward, on NSP micro-batches of a real prepared corpus (the pydoc recipe), in one process, runs
alternated (order reversed every round; each round gives both paths the same batches, a different set from
the other rounds), rates over all timed steps. Not part of the suite.

    python benchmarks/unpad.py                                   # prepares the pydoc corpus in a cache dir
    python benchmarks/unpad.py --data data/pydoc --shapes bert-base --rounds 4

A step is forward, backward and AdamW(fused), on batches carrying the collator's BatchLayout as in training.
"pad" is the share of padding in the timed padded batches (what the unpadded path does not compute), "epoch
pad" the share over 200 micro-batches spread over the epoch (how typical the timed ones are); "FLOP
ratio" is the padded step's FLOPs over the unpadded step's on the same batches (step_flops): the speed-up
that removing the padded work alone would give.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertrain.batch_layout import buckets_of
from bertrain.config import DataConfig, ModelConfig
from bertrain.data.sources.pydoc import write_pydoc_corpus
from bertrain.data.format import open_prepared
from bertrain.data.loader import build_train_loader
from bertrain.model import build_model

EPOCH_SAMPLE = 200  # micro-batches spread over the epoch for its padding share ("epoch pad")
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
                                epoch=0, micro_batch_size=micro_batch, rank=0, world_size=1)
    stride = max(len(loader.dataset) // count, 1)
    return [loader.dataset[i * stride] for i in range(min(count, len(loader.dataset)))]


def step_flops(batch: dict, hidden: int, layers: int, intermediate: int, vocab: int, unpadded: bool) -> float:
    """FLOPs of one training step (forward + backward = 3 forwards) on the work each path does: projections
    and feed-forward on every row it keeps (the last layer's output and feed-forward only where the losses
    look), attention over each row's (bucket's) width, and the MLM head at the predicted positions, which
    both paths share and which bounds the speed-up at a short length."""
    layout = batch["layout"]
    B, T, H = layout.batch_size, layout.width, hidden
    if unpadded:
        rows, last_rows = layout.real_tokens, B + layout.predicted
        attention = sum(b * width * width for b, width in (bucket.shape for bucket in buckets_of(layout.packing)))
    else:
        rows, last_rows, attention = B * T, B * layout.max_needed, B * T * T
    per_row = 4 * H * H + 2 * H * intermediate                       # QKV, output, feed-forward
    macs = (layers - 1) * rows * per_row + rows * 3 * H * H + last_rows * (H * H + 2 * H * intermediate)
    macs += layers * 2 * attention * H                                 # QK^T and attention·V
    macs += layout.predicted * (H * H + H * vocab)                     # MLM transform and decoder
    return 3 * 2 * macs


def step_fn(model, batches: list[dict], unpadded: bool):
    """One training step per call, through the batches in order; returns the real tokens it processed."""
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


def alternate(steps: dict, rounds: int, per_round: int) -> dict[str, tuple[int, float]]:
    """(real tokens, seconds) of each step function over all rounds, alternated (order reversed every round);
    round r gives every function the same `per_round` batches."""
    totals = {name: [0, 0.0] for name in steps}
    for fn in steps.values():  # warm up
        fn()
    order = list(steps.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            totals[name][0] += sum(fn() for _ in range(per_round))
            totals[name][1] += time.perf_counter() - start
    return {name: (tokens, seconds) for name, (tokens, seconds) in totals.items()}


def padding_share(batches: list[dict]) -> float:
    return 1 - sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["attention_mask"].numel() for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="Prepared DATA_DIR (default: prepare the pydoc recipe in a cache dir).")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hidden-dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    args = parser.parse_args()

    data = Path(args.data) if args.data else prepared_pydoc(Path(tempfile.gettempdir()) / "bertrain-bench-pydoc")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, data {data}, NSP, hidden dropout "
          f"{args.hidden_dropout}, attention dropout {args.attention_dropout}, AdamW(fused), {args.rounds} "
          f"alternated rounds, each on batches of its own")
    print(f"{'shape':<10} {'seq':>4} {'batch':>5} {'epoch pad':>9} {'pad':>5} {'padded tok/s':>12} "
          f"{'unpadded tok/s':>14} {'ratio':>6} {'FLOP ratio':>10}")
    for seq in (int(s) for s in args.seqs.split(",")):
        for name in args.shapes.split(","):
            H, L, heads, inter, micro = SHAPES[name]
            config = ModelConfig(type="bert", vocab_size=30522, hidden_size=H, num_hidden_layers=L,
                                 num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=512,
                                 hidden_dropout_prob=args.hidden_dropout,
                                 attention_probs_dropout_prob=args.attention_dropout)
            torch.manual_seed(0)
            model = build_model(config).train()
            per_round = 2 if H >= 768 else 4
            # distinct batches spread over the epoch: batches[0] warms up, every other one is timed once per path
            batches = sample_batches(data, seq, micro[seq], count=1 + args.rounds * per_round)
            timed = batches[1:]
            epoch_share = padding_share(sample_batches(data, seq, micro[seq], count=EPOCH_SAMPLE))
            flops = {unpadded: sum(step_flops(b, H, L, inter, config.vocab_size, unpadded) for b in timed)
                     for unpadded in (False, True)}
            totals = alternate({"padded": step_fn(model, batches, False), "unpadded": step_fn(model, batches, True)},
                               args.rounds, per_round)
            rate = {path: tokens / seconds for path, (tokens, seconds) in totals.items()}
            print(f"{name:<10} {seq:>4} {micro[seq]:>5} {epoch_share:>9.0%} {padding_share(timed):>5.0%} "
                  f"{rate['padded']:>12.0f} {rate['unpadded']:>14.0f} {rate['unpadded'] / rate['padded']:>5.2f}x "
                  f"{flops[False] / flops[True]:>9.2f}x", flush=True)
            del model


if __name__ == "__main__":
    main()

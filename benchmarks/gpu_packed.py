"""The packed (model.unpad) encoder's attention on a GPU: the variable-length flash kernel against the per-bucket
SDPA it replaced (with and without cuDNN's attention) and the padded step, on right-padded bert-base batches whose lengths change every step (as
in training). Also the three paths' losses on one batch without dropout, and a profile of the bucket path.

    python benchmarks/gpu_packed.py                      # cuda, bert-base, seq 128 x 256 and 512 x 32
    python benchmarks/gpu_packed.py --device cpu --shape tiny --steps 2   # the script's paths on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import torch
from gpu_step import SHAPES, model_config
from model_step import make_batch

import bertrain.model.layers as layers
from bertrain.batch_layout import batch_layout
from bertrain.model import build_model


def batches(config, seq: int, size: int, count: int, device) -> list[dict]:
    """`count` right-padded batches, lengths uniform in [seq/5, seq] (about 40% padding), new every batch."""
    rng, out = np.random.default_rng(0), []
    for i in range(count):
        batch = make_batch(config, size, torch.Generator().manual_seed(i), seq)
        lengths = torch.from_numpy(rng.integers(max(seq // 5, 2), seq + 1, size))
        real = torch.arange(seq)[None, :] < lengths[:, None]
        batch["attention_mask"] = real.long()
        batch["labels"] = batch["labels"].masked_fill(~real, -100)
        layout = batch_layout(batch["attention_mask"].numpy(), batch["labels"].numpy(), batch["sentence_label"].numpy())
        out.append({**{k: v.to(device) for k, v in batch.items()}, "layout": layout.to(device)})
    return out


@contextlib.contextmanager
def attention(kind: str):
    """varlen: the flash kernel where it runs (the code's choice); buckets: per-bucket SDPA without cuDNN (the
    fallback); buckets-cudnn: per-bucket SDPA as torch picks its backend (the code before the fix)."""
    available, without_cudnn = layers.varlen_flash_available, layers.without_cudnn_attention
    if kind != "varlen":
        layers.varlen_flash_available = lambda qkv, num_heads: False
    if kind == "buckets-cudnn":
        layers.without_cudnn_attention = lambda x: contextlib.nullcontext()
    try:
        yield
    finally:
        layers.varlen_flash_available, layers.without_cudnn_attention = available, without_cudnn


def run_steps(model, optimizer, data: list[dict], dtype, device) -> float:
    for batch in data:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="Profile two steps of buckets-cudnn at each size.")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = list(SHAPES[args.shape][2].items())[:2]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
          f"cudnn sdp {torch.backends.cuda.cudnn_sdp_enabled()}, flash {torch.backends.cuda.flash_sdp_enabled()}")
    for seq, size in sizes:
        config = model_config(args.shape, seq)
        torch.manual_seed(0)
        model = build_model(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        data = batches(config, seq, size, args.steps + 2, device)
        padding = 1 - sum(int(b["attention_mask"].sum()) for b in data) / (len(data) * size * seq)
        model.eval()  # losses of the three paths on one batch, no dropout
        losses = {}
        for kind, unpad in (("padded", "false"), ("buckets", "true"), ("varlen", "true")):
            model.unpad = unpad
            try:
                with attention(kind), torch.no_grad(), torch.autocast(device.type, dtype=dtype,
                                                                      enabled=dtype != torch.float32):
                    losses[kind] = float(model(**data[0]).loss)
            except Exception as error:
                losses[kind] = f"{type(error).__name__}: {str(error)[:200]}"
        print(f"seq {seq} batch {size} padding {padding:.0%}: eval losses {losses}", flush=True)
        model.train()
        for kind, unpad, steps in (("padded", "false", data[2:]), ("buckets-cudnn", "true", data[2:]),
                                   ("buckets-cudnn-fixed-shape", "true", [data[2]] * args.steps),
                                   ("buckets", "true", data[2:]), ("varlen", "true", data[2:])):
            model.unpad = unpad
            try:
                with attention(kind.removesuffix("-fixed-shape")):
                    run_steps(model, optimizer, data[:2] if "fixed" not in kind else [data[2]], dtype, device)
                    started = time.perf_counter()
                    run_steps(model, optimizer, steps, dtype, device)
                    ms = 1000 * (time.perf_counter() - started) / len(steps)
                real = sum(int(b["attention_mask"].sum()) for b in steps) / len(steps)
                print(f"  {kind:<26} {ms:8.1f} ms/step {size / ms * 1000:8.1f} seq/s {real / ms * 1000:10.0f} real tok/s",
                      flush=True)
            except Exception as error:
                print(f"  {kind:<26} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        if args.profile:
            model.unpad = "true"
            from torch.profiler import ProfilerActivity, profile
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with attention("buckets-cudnn"), profile(activities=activities) as prof:
                run_steps(model, optimizer, data[3:5], dtype, device)
            table = prof.key_averages()
            print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
            if device.type == "cuda":
                print(table.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
        del model, optimizer, data
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""One training step (forward, backward, fused AdamW: bertrain's FusedAdamW, torch's for transformers; one kernel) of
bertrain against transformers' BertForPreTraining / AlbertForPreTraining (attn_implementation="sdpa") on a GPU:
BERT-base/-large and ALBERT-base/-large at seq 128 and 512, bf16 autocast, same weights (copied with
bertrain.model.hf), same batch and masking (15% of positions), runs alternated with a large bf16 GEMM that measures
the device's peak in the same run. Prints sequences/s and useful MFU (model_step.useful_flops: 3 x forward, MLM head
at masked positions only) against that peak. `--compile`: ours with train.compile's per-layer torch.compile
(transformers stays eager), its compile time reported. `--per-weight-casts`: ours also timed with autocast casting
each weight (the plain path of EncoderLayer.weights' one cast per layer), alternated with the rest, on the same
model. Not part of the test suite; `--device cpu` runs a tiny shape in fp32 (tested).

    python benchmarks/gpu_step.py                                   # cuda, all shapes, seq 128 and 512
    python benchmarks/gpu_step.py --shapes bert-large --seqs 128 --rounds 10
    python benchmarks/gpu_step.py --shapes bert-large --seqs 128 --compile
    python benchmarks/gpu_step.py --shapes bert-large,albert-large --seqs 128 --per-weight-casts
    python benchmarks/gpu_step.py --device cpu --shapes tiny --seqs 64 --batch 4
    python benchmarks/gpu_step.py --device cpu --dtype bf16 --shapes bert-large-narrow --seqs 8 --per-weight-casts
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from model_step import gemm_fn, make_batch, reference_model, step_fn, synchronize, time_alternating, useful_flops

from bertrain.config import load_config
from bertrain.model import build_model, compile_layers
from bertrain.model.layers import EncoderLayer

SHAPES = {  # name: (shipped config, vocab size, {seq: batch on an 80 GB GPU})
    "bert-base": ("bert_base", 30522, {128: 256, 512: 32}),
    "bert-large": ("bert_large", 30522, {128: 128, 512: 16}),
    "albert-base": ("albert_base", 30000, {128: 256, 512: 32}),
    "albert-large": ("albert_large", 30000, {128: 128, 512: 16}),
    "tiny": ("tiny_bert", 1000, {32: 4, 64: 4, 128: 4}),  # for `--device cpu` (the tests)
    "tiny-albert": ("tiny_albert", 1000, {32: 4, 64: 4, 128: 4}),
    # bert-large's 24 layers at a width where a CPU step is nearly all host time (Python, dispatch, autograd): a
    # proxy of the host time a GPU step takes, e.g. `--device cpu --dtype bf16 --seqs 8 --per-weight-casts`
    "bert-large-narrow": ("bert_large", 64, {8: 1}),
}
NARROW = {"bert-large-narrow": ["model.hidden_size=16", "model.num_attention_heads=4", "model.intermediate_size=32"]}


def model_config(shape: str, seq: int):
    """The shipped config's model at this length: 512 positions as the real models (more for a longer seq)."""
    config_name, vocab, _ = SHAPES[shape]
    return load_config(config_name, [f"model.vocab_size={vocab}", f"data.max_seq_length={seq}",
                                     f"model.max_position_embeddings={max(seq, 512)}", *NARROW.get(shape, [])]).model


def build_pair(shape: str, seq: int, device: torch.device):
    """(config, ours, transformers') for a shape, on the device, the same weights: one pair serves every length
    up to `seq` (the position table is the same)."""
    config = model_config(shape, seq)
    torch.manual_seed(0)
    ours = build_model(config).train()
    theirs = reference_model(ours, config).to(device).train()  # weights copied while both are on the CPU
    return config, ours.to(device), theirs


def measure(pair, seq: int, batch_size: int, args, device: torch.device) -> dict:
    """Seconds per step of ours and transformers', and the GEMM peak, for one shape and length."""
    config, ours, theirs = pair
    batch = {k: v.to(device) for k, v in make_batch(config, batch_size, torch.Generator().manual_seed(0), seq).items()}
    dtype = None if args.dtype == "fp32" else torch.bfloat16
    gemm, gemm_flops = gemm_fn(dtype or torch.float32, args.gemm_size, device)
    ours_step, extra = step_fn(ours, batch, False, config.type, dtype, device), {}
    if args.compile:  # compiled on the first call (a second layer graph for the pruned last layer): timed apart
        started = time.perf_counter()
        ours_step()
        synchronize(device)
        extra = dict(compiled=True, compile_s=time.perf_counter() - started)
    layers = [m for m in ours.modules() if isinstance(m, EncoderLayer)]
    functions = {"ours": variant(layers, ours_step, True),
                 "hf": step_fn(theirs, batch, True, config.type, dtype, device), "gemm": gemm}
    if args.per_weight_casts:  # the same model, weights and optimizer: only the casts differ
        functions["per_weight_casts"] = variant(layers, ours_step, False)
    medians = time_alternating(functions, args.rounds, args.repeats, device)
    use_variant(layers, True)  # the next length's steps (and compile warm-up) run the default
    peak = gemm_flops / medians["gemm"]
    flops = useful_flops(config, batch_size, int((batch["labels"] != -100).sum()), seq)
    if "per_weight_casts" in medians:
        extra["per_weight_casts"] = medians["per_weight_casts"]
    return dict(ours=medians["ours"], hf=medians["hf"], peak=peak, flops=flops, **extra)


def use_variant(layers: list[EncoderLayer], fused_weight_cast: bool) -> None:
    """The encoder layers' weights cast in one kernel each (EncoderLayer.weights) or by autocast."""
    for layer in layers:
        layer.fused_weight_cast = fused_weight_cast


def variant(layers: list[EncoderLayer], step, fused_weight_cast: bool):
    """`step` in that variant (use_variant) each time it runs."""
    def run() -> None:
        use_variant(layers, fused_weight_cast)
        step()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="bert-base,bert-large,albert-base,albert-large")
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--batch", type=int, default=None, help="Sequences per step (default: per shape and seq).")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="Default: bf16 on cuda, fp32 on cpu.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="Steps per timed run.")
    parser.add_argument("--gemm-size", type=int, default=None, help="Peak GEMM size (default 8192 cuda, 1024 cpu).")
    parser.add_argument("--results", default=None, help="Append each row as a JSON line to this file.")
    parser.add_argument("--compile", action="store_true", help="Ours with each encoder layer torch.compiled.")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (e.g. eager on a CPU).")
    parser.add_argument("--per-weight-casts", action="store_true",
                        help="Also time ours with autocast casting each weight (no one-kernel cast per layer).")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    args.gemm_size = args.gemm_size or (8192 if device.type == "cuda" else 1024)

    import transformers  # heavy and only needed here

    transformers.logging.set_verbosity_error()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{name}: torch {torch.__version__}, transformers {transformers.__version__}, {args.dtype}, fused AdamW, "
          f"medians of {args.rounds} alternated rounds of {args.repeats} steps"
          + (f", ours with compiled layers ({args.compile_backend or 'inductor'})" if args.compile else ""))
    print(f"{'shape':<13} {'seq':>4} {'batch':>5} {'ours seq/s':>11} {'hf seq/s':>10} {'speed-up':>8} "
          f"{'ours MFU':>8} {'hf MFU':>7} {'peak TF/s':>9}")
    seqs = [int(s) for s in args.seqs.split(",")]
    for shape in args.shapes.split(","):
        started, pair = time.perf_counter(), None
        for seq in seqs:
            batch_size = args.batch or SHAPES[shape][2].get(seq, 8)
            try:
                if pair is None:
                    pair = build_pair(shape, max(seqs), device)
                    if args.compile:
                        options = {"backend": args.compile_backend} if args.compile_backend else {}
                        compile_layers(pair[1], **options)
                r = measure(pair, seq, batch_size, args, device)
            except Exception as error:  # e.g. out of memory: the other shapes still run
                print(f"{shape:<13} {seq:>4} {batch_size:>5} failed: {type(error).__name__}: {error}", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            print(f"{shape:<13} {seq:>4} {batch_size:>5} {batch_size / r['ours']:>11.1f} {batch_size / r['hf']:>10.1f} "
                  f"{r['hf'] / r['ours']:>7.2f}x {100 * r['flops'] / r['ours'] / r['peak']:>7.3g}% "
                  f"{100 * r['flops'] / r['hf'] / r['peak']:>6.3g}% {r['peak'] / 1e12:>9.3g}"
                  + (f"  (compiled in {r['compile_s']:.1f} s)" if args.compile else "")
                  + (f"  (per-weight casts: {batch_size / r['per_weight_casts']:.1f} seq/s, one cast per layer "
                     f"{r['per_weight_casts'] / r['ours']:.3f}x as fast)" if args.per_weight_casts else ""),
                  flush=True)
            if args.results:  # one line per row as it is measured: a run cut short keeps its rows
                with open(args.results, "a") as out:
                    out.write(json.dumps(dict(r, shape=shape, seq=seq, batch=batch_size, dtype=args.dtype)) + "\n")
        del pair
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  ({shape}: {time.perf_counter() - started:.1f} s, models built once for every length)", flush=True)


if __name__ == "__main__":
    main()

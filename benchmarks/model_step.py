"""Time one full training step (forward, backward, AdamW) of bertrain's model against transformers'
BertForPreTraining / AlbertForPreTraining in the same process: same weights, same batch, same
precision, same dropout settings, runs alternated, medians reported; each stepped by the AdamW its tool runs
(torch's fused kernel: bertrain's FusedAdamW, transformers' torch.optim.AdamW). Not part of the test suite.

    python benchmarks/model_step.py                 # all shapes, fp32, plus bf16 at bert-base where native
    python benchmarks/model_step.py --shapes tiny,small --rounds 5

Useful MFU counts the FLOPs of the work that matters (encoder, pooler, MLM head at the masked
positions only, last layer's query/output/feed-forward at masked + [CLS] rows; training = 3 × forward) over the speed of a 2048² GEMM timed among the same
alternated rounds (so both see the same machine load).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from bertrain.batch_layout import IGNORE_INDEX, layout_of
from bertrain.train.adamw import FusedAdamW
from bertrain.train.precision import cpu_has_native_bf16

SHAPES = {  # name: (type, hidden, layers, heads, intermediate, embedding, batch)
    "tiny": ("bert", 128, 2, 2, 512, None, 32),
    "small": ("bert", 256, 4, 4, 1024, None, 16),
    "bert-base": ("bert", 768, 12, 12, 3072, None, 8),
    "albert-base": ("albert", 768, 12, 12, 3072, 128, 8),
}
SEQ, MASKED = 128, 0.15


def model_config(name: str, hidden_dropout: float, attention_dropout: float):
    from bertrain.config import ModelConfig

    kind, H, L, heads, inter, E, _ = SHAPES[name]
    return ModelConfig(type=kind, vocab_size=30000 if kind == "albert" else 30522, hidden_size=H,
                       num_hidden_layers=L, num_attention_heads=heads, intermediate_size=inter, embedding_size=E,
                       hidden_act="gelu_new" if kind == "albert" else "gelu", hidden_dropout_prob=hidden_dropout,
                       attention_probs_dropout_prob=attention_dropout, max_position_embeddings=512)


def reference_model(ours, config):
    """transformers' model with our weights, with its fastest CPU attention (sdpa)."""
    import transformers

    from bertrain.model.hf import hf_config, to_hf_state_dict

    values = hf_config(config)
    cls = transformers.AlbertConfig if config.type == "albert" else transformers.BertConfig
    hf_cfg = cls(**{k: v for k, v in values.items() if k not in ("architectures", "model_type", "dtype")})
    model_cls = transformers.AlbertForPreTraining if config.type == "albert" else transformers.BertForPreTraining
    model = model_cls._from_config(hf_cfg, attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(to_hf_state_dict(ours), strict=False)
    assert not unexpected and all("decoder" in k for k in missing), (missing, unexpected)
    return model


def make_batch(config, batch: int, generator: torch.Generator, seq: int = SEQ) -> dict:
    ids = torch.randint(5, config.vocab_size, (batch, seq), generator=generator)
    picked = torch.rand(batch, seq, generator=generator) < MASKED
    picked[:, 0] = False
    labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
    ids = torch.where(picked, torch.full_like(ids, 4), ids)
    token_types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=token_types, labels=labels,
                sentence_label=torch.randint(0, 2, (batch,), generator=generator))


CPU = torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where every op has finished on return)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_fn(model, batch: dict, reference: bool, kind: str, dtype: torch.dtype | None, device: torch.device = CPU,
            mark=None):
    """A closure running one training step (fused AdamW) of `model` on `batch`, autocast to `dtype` when given;
    `reference`: transformers' model (its own name for the sentence label), stepped by torch's AdamW(fused=True);
    ours by bertrain's FusedAdamW (the same kernel, its lists kept between steps: less host time), given the
    batch's layout as training gives it: built once on the host, as the collator builds it with the batch, so
    that the step reads nothing back from the device (building it from the device tensors in every step read
    three of them back: three syncs a step on a GPU, which training never makes). `mark(name)`, when given, is called
    at the step's start and after its forward, backward and optimizer step (gpu_host_lead.py)."""
    fused = device.type in ("cuda", "cpu")
    optimizer = (FusedAdamW(model.parameters(), lr=1e-5) if fused and not reference else
                 torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused))
    args = dict(batch)
    if reference:
        args[("sentence_order_label" if kind == "albert" else "next_sentence_label")] = args.pop("sentence_label")
    else:
        args["layout"] = layout_of(batch.get("attention_mask"), batch["labels"], batch.get("sentence_label"))

    marked = mark or (lambda name: None)
    return lambda: bare_step(model, optimizer, args, device, dtype, marked)


def bare_step(model, optimizer, args: dict, device: torch.device, dtype: torch.dtype | None, mark) -> None:
    """zero_grad, forward (autocast to `dtype` when given), backward, optimizer step: nothing else; `mark(name)` at
    the step's start and after each of the three."""
    mark("step start")
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(**args).loss
    mark("forward end")
    loss.backward()
    mark("backward end")
    optimizer.step()
    mark("optimizer end")


def gemm_fn(dtype: torch.dtype, n: int = 2048, device: torch.device = CPU):
    """A square n×n GEMM and its FLOPs: timed among the steps, so the peak sees the same machine load."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return (lambda: a @ b), 2 * n ** 3


def useful_flops(config, batch: int, n_masked: int, seq: int = SEQ) -> float:
    """Training FLOPs of the work that matters: 3 × forward, with the MLM head at the masked
    positions only and the last layer's query/output/feed-forward only at masked + [CLS] rows."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    E = config.embedding_size or H
    applications = L * (config.inner_group_num if config.type == "albert" else 1)
    tokens, needed = batch * seq, n_masked + batch
    layer = 2 * (4 * H * H + 2 * H * I) + 2 * 2 * seq * H  # per token: projections, feed-forward, attention
    last = tokens * 2 * (2 * H * H) + needed * (2 * (2 * H * H + 2 * H * I) + 2 * 2 * seq * H)
    flops = tokens * layer * (applications - 1) + last
    if config.type == "albert":
        flops += tokens * 2 * E * H
    flops += n_masked * 2 * (H * E + E * config.vocab_size) + batch * 2 * (H * H + 2 * H)
    return 3 * flops


def time_alternating(functions: dict, rounds: int, repeats: int, device: torch.device = CPU) -> dict:
    """Median seconds per call of each function, runs alternated (order reversed every round)."""
    for fn in functions.values():  # warm up: kernels picked, allocator filled
        fn()
    synchronize(device)
    times: dict = {name: [] for name in functions}
    order = list(functions.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            synchronize(device)
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=None,
                        help="Steps per timed run (default: 2 at hidden size >= 768, else 8).")
    parser.add_argument("--hidden-dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    parser.add_argument("--no-bf16", action="store_true", help="Skip the bf16 autocast run at bert-base.")
    parser.add_argument("--bf16", action="store_true",
                        help="Run bf16 at bert-base even on a CPU without native bf16 (emulated: very slow).")
    args = parser.parse_args()
    if not args.no_bf16 and not args.bf16 and not cpu_has_native_bf16():
        print("This CPU has no native bf16 (AVX512_BF16 / AMX): bf16 skipped (--bf16 to force it).")
        args.no_bf16 = True

    import transformers

    from bertrain.model import build_model

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    (gemm32, flops32) = gemm_fn(torch.float32)
    (gemm16, flops16) = (None, None) if args.no_bf16 else gemm_fn(torch.bfloat16)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"seq {SEQ}, {MASKED:.0%} masked, hidden dropout {args.hidden_dropout}, attention dropout "
          f"{args.attention_dropout} (ALBERT shapes: 0 / 0), AdamW(fused=True), medians of {args.rounds} alternated rounds")
    header = (f"{'shape':<12} {'prec':<5} {'batch':>5} {'ours ms':>9} {'hf ms':>9} {'speed-up':>8} {'useful MFU':>10} "
              f"{'GEMM peak':>10}")
    print(header)
    for name in args.shapes.split(","):
        kind, _, _, _, _, _, batch_size = SHAPES[name]
        hidden_p, attention_p = (0.0, 0.0) if kind == "albert" else (args.hidden_dropout, args.attention_dropout)
        config = model_config(name, hidden_p, attention_p)
        ours = build_model(config).train()
        theirs = reference_model(ours, config).train()
        batch = make_batch(config, batch_size, torch.Generator().manual_seed(0))
        precisions = [False, True] if name == "bert-base" and not args.no_bf16 else [False]
        steps_by_name = {}
        for bf16 in precisions:
            dtype = torch.bfloat16 if bf16 else None
            steps_by_name[("ours", bf16)] = step_fn(ours, batch, False, kind, dtype)
            steps_by_name[("hf", bf16)] = step_fn(theirs, batch, True, kind, dtype)
        if True in precisions:  # the residual stream as plain autocast leaves it (model.float32_residual)
            ours_float32_residual = build_model(dataclasses.replace(config, float32_residual=True)).train()
            ours_float32_residual.load_state_dict(ours.state_dict())
            steps_by_name[("ours, float32 residual", True)] = step_fn(ours_float32_residual, batch, False, kind,
                                                                      torch.bfloat16)
        steps_by_name["gemm", False] = gemm32
        if True in precisions:  # the emulated bf16 GEMM alone takes minutes per round on an AVX2-only CPU
            steps_by_name["gemm", True] = gemm16
        repeats = args.repeats or (2 if SHAPES[name][1] >= 768 else 8)
        medians = time_alternating(steps_by_name, args.rounds, repeats)
        n_masked = int((batch["labels"] != IGNORE_INDEX).sum())
        for bf16 in precisions:
            t_ours, t_theirs = medians[("ours", bf16)], medians[("hf", bf16)]
            peak = (flops16 if bf16 else flops32) / medians["gemm", bf16]
            mfu = useful_flops(config, batch_size, n_masked) / t_ours / peak
            print(f"{name:<12} {'bf16' if bf16 else 'fp32':<5} {batch_size:>5} {t_ours * 1e3:>9.1f} "
                  f"{t_theirs * 1e3:>9.1f} {t_theirs / t_ours:>7.2f}x {mfu:>9.0%} {peak / 1e9:>6.0f} GF/s", flush=True)
        if len(precisions) == 2:
            print(f"{'':<12} ours bf16 vs ours fp32: {medians[('ours', False)] / medians[('ours', True)]:.2f}x")
            print(f"{'':<12} ours bf16 with float32 residual: {medians[('ours, float32 residual', True)] * 1e3:.1f} "
                  f"ms, the bf16 residual's speed-up: "
                  f"{medians[('ours, float32 residual', True)] / medians[('ours', True)]:.2f}x")
        del ours, theirs, steps_by_name  # (and the float32-residual copy, with the steps)


if __name__ == "__main__":
    main()

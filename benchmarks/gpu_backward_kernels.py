"""The eager backward's two slowest memory-bound kernels at bert-large's shapes, against other ways to compute the same
values: the bias gradients' `sum` over the tokens (3.86 ms of an H200 bert-large step, about half the bandwidth) and
LayerNorm's backward (5.46 ms, about 113 us a call where moving its bytes takes about 25). The eager step is 1.45x
transformers' against issue 25's 1.5x: a 2.8 ms shorter step. Each row: the median device us a call over alternated
rounds, the host ahead (the device sleeps while the host queues the calls: lamb_kernels.device_ms), the GB/s of the
bytes it must move, its speed against the first row of its case (what the eager step runs now), the wall us a call,
and its largest difference from that row's values over their largest magnitude. "compiled" rows are inductor's kernels
for the same op: what a better kernel reaches. On a CPU the times mean nothing (a tiny shape runs in the tests).

    python benchmarks/gpu_backward_kernels.py --results OUT.jsonl          # bert-large seq 128 x 128: 16,384 tokens
    python benchmarks/gpu_backward_kernels.py --device cpu --tokens 64 --hidden 32 --rounds 2 --compile-backend eager
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from lamb_kernels import device_ms
from model_step import time_alternating

Case = dict  # variant name → zero-argument function returning the values (a tensor or a tuple of them)


def bias_grad_case(grad: torch.Tensor, compile_fn) -> Case:
    """The bias gradient of a linear whose output gradient is `grad` [N, W]: AddmmBackward0 sums it over N."""
    ones = torch.ones(1, grad.shape[0], dtype=grad.dtype, device=grad.device)
    summed = compile_fn(lambda g: g.sum(0))
    return {"sum over tokens (now)": lambda: grad.sum(0),
            "sum, float32 out": lambda: grad.sum(0, dtype=torch.float32),
            "ones @ grad (GEMM)": lambda: torch.mm(ones, grad)[0],
            "compiled sum": lambda: summed(grad)}


def layer_norm_case(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    compile_fn) -> Case:
    """LayerNorm's backward over [N, H] (dx, dweight, dbias), whole and in its two parts."""
    shape, eps = [x.shape[-1]], 1e-12
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)

    def backward(mask):
        return lambda: torch.ops.aten.native_layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask)

    compiled = compile_fn(lambda g: torch.ops.aten.native_layer_norm_backward(
        g, x, shape, mean, rstd, weight, bias, [True, True, True]))
    return {"native_layer_norm_backward (now)": backward([True, True, True]),
            "compiled": lambda: compiled(grad),
            "input gradient only": backward([True, False, False]),
            "weight and bias gradients only": backward([False, True, True])}


def gelu_bias_case(grad: torch.Tensor, pre_activation: torch.Tensor, approximate: str, compile_fn) -> Case:
    """The feed-forward's GELU backward, then its up-projection's bias gradient: two kernels now, one fused."""
    def both(g):
        g = torch.ops.aten.gelu_backward(g, pre_activation, approximate=approximate)
        return g, g.sum(0)

    fused = compile_fn(both)
    return {"gelu_backward, then sum (now)": lambda: both(grad), "compiled, fused": lambda: fused(grad)}


def moved_bytes(values, inputs: list[torch.Tensor]) -> int:
    """The bytes a kernel must read (`inputs`) and write (`values`)."""
    outputs = values if isinstance(values, (tuple, list)) else (values,)
    return sum(t.numel() * t.element_size() for t in [*inputs, *[o for o in outputs if o is not None]])


def largest_difference(values, reference) -> float:
    """max |values - reference| over max |reference|, over every output."""
    pairs = zip(values, reference) if isinstance(values, (tuple, list)) else [(values, reference)]
    worst = 0.0
    for a, b in pairs:
        if a is None or b is None:
            continue
        scale = b.float().abs().max().clamp(min=1e-30)
        worst = max(worst, float((a.float() - b.float()).abs().max() / scale))
    return worst


def cases(args, device: torch.device, dtype: torch.dtype, compile_fn) -> dict[str, tuple[Case, list[torch.Tensor]]]:
    """Every case by name, with the tensors its variants read (for the bytes they must move)."""
    g = torch.Generator(device=device).manual_seed(0)
    N, H, I = args.tokens, args.hidden, 4 * args.hidden

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    found = {}
    for width, what in ((3 * H, "query/key/value"), (H, "attention output and down"), (I, "up")):
        grad = randn(N, width)
        found[f"bias gradient, {what} [{N}, {width}]"] = (bias_grad_case(grad, compile_fn), [grad])
    grad, x = randn(N, H), randn(N, H)
    weight, bias = randn(H, scale=0.1) + 1, randn(H, scale=0.1)
    found[f"LayerNorm backward [{N}, {H}]"] = (layer_norm_case(grad, x, weight, bias, compile_fn),
                                              [grad, x, weight])
    grad, pre = randn(N, I), randn(N, I)
    found[f"GELU backward + up bias gradient [{N}, {I}]"] = (gelu_bias_case(grad, pre, args.approximate, compile_fn),
                                                            [grad, pre])
    return found


def device_seconds(case: Case, device: torch.device, rounds: int, repeats: int) -> tuple[dict, dict]:
    """Each variant's median device seconds a call with the host ahead (lamb_kernels.device_ms: the device sleeps
    while the host queues the calls, so a variant whose host work outlasts its kernels is still timed by its
    kernels), alternated, and whether the host was ahead in every round. On a CPU: wall seconds."""
    times: dict[str, list[float]] = {name: [] for name in case}
    ahead = dict.fromkeys(case, True)
    order = list(case.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            ms, was_ahead = device_ms(fn, device, repeats)
            times[name].append(ms / 1e3)
            ahead[name] = ahead[name] and was_ahead
    return {name: statistics.median(values) for name, values in times.items()}, ahead


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="default: bfloat16 on a GPU, float32 on a CPU")
    parser.add_argument("--tokens", type=int, default=16384, help="N: bert-large seq 128 x batch 128 by default")
    parser.add_argument("--hidden", type=int, default=1024, help="H (the intermediate size is 4H)")
    parser.add_argument("--approximate", choices=("none", "tanh"), default="none", help="BERT's GELU: none (erf)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--compile-backend", default="inductor", help="the compiled rows' torch.compile backend")
    parser.add_argument("--results", default=None, help="append one JSON line a row here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    compile_fn = lambda fn: torch.compile(fn, backend=args.compile_backend, dynamic=False)  # noqa: E731
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {dtype}, {args.rounds} rounds x {args.repeats} calls")
    print("| case | variant | device us a call | GB/s | speed vs now | wall us a call | largest difference |\n"
          "|---|---|---|---|---|---|---|")
    rows = []
    for case_name, (case, inputs) in cases(args, device, dtype, compile_fn).items():
        wall = time_alternating(case, args.rounds, args.repeats, device)
        seconds, ahead = device_seconds(case, device, args.rounds, args.repeats)
        reference = next(iter(case.values()))()
        now = next(iter(seconds.values()))
        for variant, fn in case.items():
            values = fn()
            row = dict(case=case_name, variant=variant, device=name, dtype=str(dtype), us=seconds[variant] * 1e6,
                       host_ahead=ahead[variant], wall_us=wall[variant] * 1e6,
                       gb_per_s=moved_bytes(values, inputs) / seconds[variant] / 1e9,
                       speed_vs_now=now / seconds[variant], largest_difference=largest_difference(values, reference))
            rows.append(row)
            pace = "" if row["host_ahead"] else " (the host's pace)"
            print(f"| {case_name} | {variant} | {row['us']:.1f}{pace} | {row['gb_per_s']:.0f} | "
                  f"{row['speed_vs_now']:.2f}x | {row['wall_us']:.1f} | {row['largest_difference']:.1e} |", flush=True)
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()

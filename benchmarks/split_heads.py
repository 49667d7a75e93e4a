"""The query/key/value split's backward: layers.split_heads (one copy into [B, T, 3H]) against autograd's
view + permute + unbind (a stack into [3, B, heads, T, d], then a copy to reorder), on random gradients; medians of
alternated rounds, the ratio in the same run. Not part of the suite (a tiny shape runs in the tests).

    python benchmarks/split_heads.py                          # bert-large's 32 x 128, fp32 and bf16
    python benchmarks/split_heads.py --batch 2 --seq 16 --hidden 64 --heads 4 --rounds 1
"""

from __future__ import annotations

import argparse

import torch
from model_step import time_alternating

from bertrain.model.layers import split_heads


def autograd_unbind(projected: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    """The split before split_heads: autograd makes the backward."""
    B, T, width = projected.shape
    return projected.view(B, T, 3, heads, width // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)


def split_heads_of_three(projected: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    return split_heads(projected, 3, heads)


def backward_of(split, projected: torch.Tensor, upstream: list[torch.Tensor], heads: int):
    """One backward pass through `split`, the gradient cleared first."""
    def step() -> None:
        projected.grad = None
        torch.autograd.backward(split(projected, heads), upstream)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="Backward passes per timed run.")
    args = parser.parse_args()
    B, T, H, heads = args.batch, args.seq, args.hidden, args.heads
    print(f"backward of the q/k/v split, [{B}, {T}, 3 x {H}], {heads} heads, {torch.get_num_threads()} threads, "
          f"medians of {args.rounds} alternated rounds of {args.repeats}")
    print(f"{'dtype':<9} {'autograd unbind ms':>18} {'split_heads ms':>14} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        projected = torch.randn(B, T, 3 * H, dtype=dtype, requires_grad=True)
        upstream = [torch.randn(B, heads, T, H // heads, dtype=dtype) for _ in range(3)]
        medians = time_alternating({"unbind": backward_of(autograd_unbind, projected, upstream, heads),
                                    "split_heads": backward_of(split_heads_of_three, projected, upstream, heads)},
                                   args.rounds, args.repeats)
        old, new = 1e3 * medians["unbind"], 1e3 * medians["split_heads"]
        print(f"{str(dtype).removeprefix('torch.'):<9} {old:>18.3f} {new:>14.3f} {new / old:>5.2f}x")


if __name__ == "__main__":
    main()

"""A shared ALBERT layer's half-precision weight copies, made once a forward for all its applications (run_steps,
the default) against a copy per application (each application's forward ignoring the shared copies, as every
application cast its own before), alternated in one process under autocast: step time (forward, backward, fused
AdamW) and the bytes the backward holds (the storages of the saved tensors). Both give the same gradients bit for
bit (tests/test_weight_cast.py). Not part of the test suite.

    python benchmarks/shared_copies.py                                      # albert_base, batch 8 x 128, bf16
    python benchmarks/shared_copies.py --config albert_large --hidden 256 --rounds 11
"""

from __future__ import annotations

import argparse
import functools

import torch
from model_step import make_batch, time_alternating

from bertrain.batch_layout import layout_of
from bertrain.config import load_config
from bertrain.model import build_model
from bertrain.model.layers import EncoderLayer

SHARED_FORWARD = EncoderLayer.forward


def copy_per_application(self, x, where, rows=None, copies=None):
    """EncoderLayer.forward without the shared copies: the layer copies its weights again at each application."""
    return SHARED_FORWARD(self, x, where, rows)


def saved_bytes(step_forward) -> int:
    """Bytes of the distinct storages a forward saves for its backward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step_forward()
    loss.backward()
    return sum(storages.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="albert_base", help="Shipped ALBERT config (its layers and sharing).")
    parser.add_argument("--hidden", type=int, default=None, help="Hidden size (heads of 64, intermediate 4x).")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16 if args.dtype == "bf16" else torch.float16
    sets = ["model.vocab_size=1000", "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0"]
    if args.hidden:
        sets += [f"model.hidden_size={args.hidden}", f"model.num_attention_heads={max(args.hidden // 64, 1)}",
                 f"model.intermediate_size={4 * args.hidden}"]
    config = load_config(args.config, sets).model
    torch.manual_seed(0)
    model = build_model(config).train().to(device)
    batch = {k: v.to(device) for k, v in make_batch(config, args.batch, torch.Generator().manual_seed(0),
                                                     args.seq).items()}
    batch["layout"] = layout_of(batch["attention_mask"], batch["labels"], batch["sentence_label"])  # as training
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def forward() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype):
            return model(**batch).loss

    def step(variant: str) -> None:
        EncoderLayer.forward = SHARED_FORWARD if variant == "shared" else copy_per_application
        optimizer.zero_grad(set_to_none=True)
        forward().backward()
        optimizer.step()

    variants = ["shared", "per application"]
    held = {}
    for variant in variants:
        step(variant)  # warm up; the variant stays set for the measurement
        optimizer.zero_grad(set_to_none=True)
        held[variant] = saved_bytes(forward)
    medians = time_alternating({variant: functools.partial(step, variant) for variant in variants}, args.rounds, 2,
                               device)
    EncoderLayer.forward = SHARED_FORWARD
    shared, each = (medians[v] for v in variants)
    applications = config.num_hidden_layers
    print(f"{args.config} (hidden {config.hidden_size}, {applications} applications of "
          f"{config.num_hidden_groups * config.inner_group_num} layer(s)), batch {args.batch} x {args.seq}, "
          f"{args.dtype} autocast on {device}, medians of {args.rounds} alternated rounds of 2 steps")
    print(f"  {'copies':<16} {'step ms':>9} {'saved for backward MB':>22}")
    for variant, seconds in (("shared", shared), ("per application", each)):
        print(f"  {variant:<16} {seconds * 1e3:>9.1f} {held[variant] / 2**20:>22.1f}")
    print(f"  shared copies: {each / shared:.3f}x the speed, {(held['per application'] - held['shared']) / 2**20:.1f} "
          f"MB less held for the backward")


if __name__ == "__main__":
    main()

"""Host time of Accelerate's per-step wrappers, each against the call it wraps, in one process, alternated.

    python benchmarks/accelerate_wrappers.py
    python benchmarks/accelerate_wrappers.py --mixed-precision bf16 --rounds 9 --calls 2000

On a one-element model, so that nearly all of each call is host time (what a loop that the host limits pays):
- optimizer: AcceleratedOptimizer.step() + zero_grad() against the optimizer's own, as optimizer_step calls them
  where the wrapper only passes the call on (bertrain/train/step.py, unwrap_plain);
- forward: the prepared model's forward (Accelerate's autocast and fp32 conversion of the outputs) against the
  original forward under the same autocast;
- backward: accelerator.backward(loss) (a division by the accumulation steps first) against loss.backward(), as
  train_step calls it where those are 1 (bertrain/train/step.py, backward).
Medians over rounds of microseconds per call; "extra" is the wrapper's time minus the bare call's. Not part of the
suite.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from accelerate import Accelerator


def pairs(accelerator: Accelerator, dtype: torch.dtype | None) -> dict[str, tuple]:
    """{name: (through Accelerate, bare)}: callables doing the same work."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    wrapped_model, wrapped_optimizer = accelerator.prepare(model, optimizer)
    original = getattr(wrapped_model, "_original_forward", wrapped_model.forward)
    x = torch.ones(1, 1)

    def autocast():  # what the prepared forward enters: nothing without mixed precision
        return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def bare_forward():
        with autocast():
            return original(x)

    def wrapped_step():
        wrapped_optimizer.step()
        wrapped_optimizer.zero_grad(set_to_none=True)

    def bare_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model(x).sum().backward()  # gradients for the optimizer to step on (kept: zero_grad only runs after a step)
    return {"optimizer step + zero_grad": (wrapped_step, bare_step),
            "forward": (lambda: wrapped_model(x), bare_forward),
            "backward": (lambda: accelerator.backward(bare_forward().sum()),
                         lambda: bare_forward().sum().backward())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixed-precision", choices=["no", "bf16"], default="no")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000, help="Calls per round and variant.")
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=True)
    dtype = torch.bfloat16 if args.mixed_precision == "bf16" else None
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, mixed_precision {args.mixed_precision}, "
          f"medians of {args.rounds} alternated rounds of {args.calls} calls")
    print(f"{'call':<27} {'Accelerate us':>13} {'bare us':>8} {'extra us':>9}")
    for name, (wrapped, bare) in pairs(accelerator, dtype).items():
        times: dict[str, list[float]] = {"wrapped": [], "bare": []}
        order = [("wrapped", wrapped), ("bare", bare)]
        for fn in (wrapped, bare):
            fn()
        for r in range(args.rounds):
            for variant, fn in (order if r % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[variant].append((time.perf_counter() - start) / args.calls * 1e6)
        extra = statistics.median(w - b for w, b in zip(times["wrapped"], times["bare"]))
        print(f"{name:<27} {statistics.median(times['wrapped']):>13.1f} {statistics.median(times['bare']):>8.1f} "
              f"{extra:>+9.1f}")


if __name__ == "__main__":
    main()

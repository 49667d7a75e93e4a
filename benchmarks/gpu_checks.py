"""Two short GPU checks of gpu_suite.sh, each printing a table and, with --results, JSON lines.

`sync`: the training step (the real loader's pinned batches, train_step, optimizer_step, the non-finite
watch; 2 micro-batches a step, bf16 through Accelerate) under torch.cuda.set_sync_debug_mode: steps
counted in "warn" mode (every synchronization and the line that caused it), then one step in "error"
mode. On a CPU, which has no device syncs, the host reads that would be syncs (Tensor.item, tolist,
bool, int, float, nonzero, masked_select, boolean-mask indexing) are counted instead.
`optimizer`: LAMB (as the loop builds it: its Triton kernel on a GPU) and LAMB with torch ops against torch's
fused AdamW on a shipped config's parameters with random gradients, `found_inf` set as the loop sets it;
alternated, medians. First the kernel's weights are compared with the torch ops' after 3 steps.

    python benchmarks/gpu_checks.py sync --data DATA_DIR --case bert_base:adamw --case albert_base:lamb
    python benchmarks/gpu_checks.py optimizer --config bert_base
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import time
import traceback
import warnings
from pathlib import Path

import torch
from model_step import synchronize, time_alternating

HERE = str(Path(__file__).resolve())
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "masked_select")
SYNC_WARNING = "synchroniz"  # torch's sync debug mode warns "called a synchronizing CUDA operation"


def sync_site(frames: list[traceback.FrameSummary], what: str) -> str:
    """'file:line (what in torch/file:line)' of the code that caused a sync: the innermost frame outside torch and
    this file, and the innermost bertrain frame too when that one is elsewhere (e.g. in accelerate)."""
    frames = [f for f in frames if f.filename != HERE and not f.filename.endswith(f"{os.sep}warnings.py")]
    if not frames:
        return f"unknown ({what})"
    in_torch = [f for f in frames if f.filename.startswith(TORCH_DIR)]
    outside = [f for f in frames if not f.filename.startswith(TORCH_DIR)]
    ours = [f for f in outside if f"{os.sep}bertrain{os.sep}" in f.filename]
    caller = outside[-1] if outside else frames[-1]
    names = [f"{short(caller.filename)}:{caller.lineno}"]
    if ours and ours[-1] is not caller:
        names.append(f"from {short(ours[-1].filename)}:{ours[-1].lineno}")
    via = f" in torch/{in_torch[-1].filename[len(TORCH_DIR) + 1:]}:{in_torch[-1].lineno}" if in_torch else ""
    return f"{', '.join(names)} ({what}{via})"


def short(filename: str) -> str:
    """A path from the repository root (bertrain/..., benchmarks/...) or from site-packages."""
    for root in (str(Path(HERE).parent.parent) + os.sep, f"site-packages{os.sep}", f"dist-packages{os.sep}"):
        if root in filename:
            return filename.split(root, 1)[1]
    return filename


@contextlib.contextmanager
def recording_sync_warnings(found: collections.Counter):
    """Counts torch's sync warnings inside by the Python stack that raised them (the warning's own file and
    line is torch's, which says nothing about the caller)."""
    def record(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            found[sync_site(traceback.extract_stack()[:-1], "sync")] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        yield found


@contextlib.contextmanager
def counting_syncs(device: torch.device):
    """Yields a Counter of 'file:line (what)' for each device sync (CUDA) or host read (CPU) inside."""
    found: collections.Counter = collections.Counter()
    if device.type == "cuda":
        with recording_sync_warnings(found):
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield found
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS + ("__getitem__",)}

    def where(what: str) -> str:
        return sync_site(traceback.extract_stack()[:-2], what)

    def counted(name):
        def method(self, *args, **kwargs):
            found[where(f"Tensor.{name}")] += 1
            return saved[name](self, *args, **kwargs)
        return method

    def getitem(self, index):
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in (index if isinstance(index, tuple)
                                                                                  else (index,))):
            found[where("boolean-mask indexing")] += 1
        return saved["__getitem__"](self, index)

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, counted(name))
        torch.Tensor.__getitem__ = getitem
        yield found
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def sync_overrides(optimizer_name: str, unpad: str, args) -> list[str]:
    return [f"optim.name={optimizer_name}", f"model.unpad={unpad}", f"data.max_seq_length={args.seq}",
            "data.num_workers=0", f"train.mixed_precision={args.mixed_precision}", *args.set]


def sync_case(config_name: str, optimizer_name: str, unpad: str, args) -> dict:
    """Syncs in the first step (lazy optimizer state), in the next ones, and whether "error" mode passes."""
    from accelerate.state import AcceleratorState

    from bertrain.config import load_config
    from bertrain.model import build_model
    from bertrain.train.optim import build_optimizer
    from bertrain.train.setup import build_accelerator, resolve_run_config
    from bertrain.train.step import LossScale, NonFiniteWatch, optimizer_step, train_step
    from bertrain.train.stream import TrainStream

    overrides = sync_overrides(optimizer_name, unpad, args)
    config, prepared = resolve_run_config(load_config(config_name, overrides), args.data, None)
    AcceleratorState._reset_state(True)
    accelerator = build_accelerator(config.train)
    torch.manual_seed(0)
    model = build_model(config.model).train()
    optimizer = build_optimizer(model, config.optim, accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    stream = TrainStream(prepared, config.data, seed=0, micro_batch_size=args.micro_batch, rank=0, world_size=1,
                         epoch=0, micro_batch=0, device_type=accelerator.device.type)
    watch = NonFiniteWatch()
    loss_scale = LossScale(accelerator.scaler) if accelerator.scaler is not None else None  # fp16: one read a step

    def step():
        batches = [stream.next(), stream.next()]  # outside: the loader is not the step
        with counting_syncs(accelerator.device) as found:
            result = train_step(model, accelerator, batches, max_grad_norm=1.0)
            optimizer_step(optimizer, result, loss_scale)
            watch.add(result.finite)
        return found, result

    first, result = step()
    later: collections.Counter = collections.Counter()
    for _ in range(args.steps - 1):
        found, result = step()
        later.update(found)
    error_mode = "n/a (CPU)"
    if accelerator.device.type == "cuda":
        batches = [stream.next(), stream.next()]
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = train_step(model, accelerator, batches, max_grad_norm=1.0)
            optimizer_step(optimizer, result, loss_scale)
            watch.add(result.finite)
            error_mode = "passed"
        except RuntimeError as error:
            site = sync_site(traceback.extract_tb(error.__traceback__), "raised")
            error_mode = f"raised at {site}: {str(error)[:80]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    loss = result.read(accelerator)["loss"]  # the log-time read, outside the counted steps
    return dict(case=f"{config_name}+{optimizer_name}, unpad {unpad}", first_step=sum(first.values()),
                later_steps=sum(later.values()), steps=args.steps, error_mode=error_mode, loss=loss,
                where=dict(first + later), method="sync debug mode" if accelerator.device.type == "cuda"
                else "host reads (CPU)")


def optimizer_case(args) -> dict:
    """ms per step of fused AdamW (torch's, and bertrain's FusedAdamW), LAMB (its kernel) and LAMB with torch ops on
    the config's parameters, and how far the kernel's weights are from the torch ops' after a few steps from the same
    start."""
    from bertrain.config import load_config
    from bertrain.model import build_model
    from bertrain.train.adamw import FusedAdamW
    from bertrain.train.lamb import Lamb, own_kernel
    from bertrain.train.optim import lamb_groups, optimizer_groups, row_blocks_of
    from bertrain.train.step import clip_scale

    device = torch.device(args.device)
    model = build_model(load_config(args.config, ["model.vocab_size=30522"]).model).to(device)
    groups = lamb_groups(optimizer_groups(model, 0.01))
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    kernel = own_kernel(list(model.parameters()))
    blocks = row_blocks_of(model)  # as build_optimizer: query, key and value a trust ratio each
    difference = kernel_vs_torch_ops(groups, device, blocks)
    found_inf = torch.zeros((), device=device)  # what optimizer_step hands both (a finite step)
    optimizers = {"fused AdamW": torch.optim.AdamW(groups, lr=1e-4, fused=True),
                  "FusedAdamW": FusedAdamW(groups, lr=1e-4),
                  "LAMB": Lamb(groups, lr=1e-4, row_blocks=blocks),
                  "LAMB, torch ops": Lamb(groups, lr=1e-4, native=False, row_blocks=blocks)}
    for optimizer in optimizers.values():
        optimizer.found_inf = found_inf
    steps = {name: o.step for name, o in optimizers.items()}
    # Clipping (max norm above the gradients' norm: a factor of 1, the weights' path unchanged) in place, as torch's
    # clip_grad_norm_, then the step; or as the step's grad_scale, as train/step.py's optimizer_step clips.
    params = list(model.parameters())
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    for name in ("fused AdamW", "LAMB"):
        optimizer = optimizers[name]
        steps[f"{name}, clipped in place"] = lambda o=optimizer: (
            torch.nn.utils.clip_grads_with_norm_(params, 1e9, norm), o.step())
        steps[f"{name}, clipped as grad_scale"] = lambda o=optimizer: (
            setattr(o, "grad_scale", clip_scale(norm, 1e9)), o.step(), delattr(o, "grad_scale"))
    medians = time_alternating(steps, args.rounds, args.repeats, device)
    return dict(config=args.config, parameters=sum(p.numel() for p in model.parameters()), device=str(device),
                kernel=kernel.__name__.rsplit(".", 1)[-1] if kernel else "torch ops", kernel_vs_torch_ops=difference,
                adamw_ms=1e3 * medians["fused AdamW"], lamb_ms=1e3 * medians["LAMB"],
                lamb_torch_ops_ms=1e3 * medians["LAMB, torch ops"], ratio=medians["LAMB"] / medians["fused AdamW"],
                clip_in_place_ms=1e3 * medians["fused AdamW, clipped in place"],
                clip_scale_ms=1e3 * medians["fused AdamW, clipped as grad_scale"],
                lamb_clip_in_place_ms=1e3 * medians["LAMB, clipped in place"],
                lamb_clip_scale_ms=1e3 * medians["LAMB, clipped as grad_scale"],
                fused_adamw_ms=1e3 * medians["FusedAdamW"],
                adamw_host_ms=host_ms(optimizers["fused AdamW"].step, device),
                fused_adamw_host_ms=host_ms(optimizers["FusedAdamW"].step, device),
                lamb_host_ms=host_ms(optimizers["LAMB"].step, device))


def host_ms(step, device: torch.device, steps: int = 20) -> float:
    """Host milliseconds per call without waiting for the device: a step whose host time nears its device time
    is launch-bound (on a CPU both are the same time)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - start
    synchronize(device)
    return 1e3 * elapsed / steps


def kernel_vs_torch_ops(groups: list[dict], device: torch.device, blocks: dict, steps: int = 3) -> float:
    """Largest |w_kernel - w_torch_ops| over the largest |w_torch_ops - w_start| after `steps` LAMB steps of the
    same gradients, with `blocks` (LAMB's row blocks) as in training: float32 rounding (torch's float32 norms over
    up to 23M elements) keeps it below 1e-4, a trust ratio 0.1% off makes it 1e-3."""
    from bertrain.train.lamb import Lamb

    start = [[p.detach().clone() for p in g["params"]] for g in groups]
    copies = {native: [dict(g, params=[w.clone().requires_grad_() for w in weights]) for g, weights in
                       zip(groups, start)] for native in (True, False)}
    originals = [p for g in groups for p in g["params"]]
    optimizers = {native: Lamb(copy, lr=1e-2, weight_decay=0.01, native=native, row_blocks={
        param: blocks[original] for param, original in zip((p for g in copy for p in g["params"]), originals)
        if original in blocks}) for native, copy in copies.items()}
    generator = torch.Generator(device).manual_seed(0)
    for _ in range(steps):
        grads = [torch.randn(w.shape, generator=generator, device=device) * 1e-3 for g in start for w in g]
        for native, optimizer in optimizers.items():
            for param, grad in zip((p for g in copies[native] for p in g["params"]), grads):
                param.grad = grad.clone()
            optimizer.step()
    return relative_difference([p.detach() for g in copies[True] for p in g["params"]],
                               [p.detach() for g in copies[False] for p in g["params"]], [w for g in start for w in g])


def relative_difference(weights: list[torch.Tensor], reference: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """Largest |w - w_reference| over the largest weight change of the reference from `start`."""
    moved = max(float((r - s).abs().max()) for r, s in zip(reference, start))
    return max(float((w - r).abs().max()) for w, r in zip(weights, reference)) / moved


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["sync", "optimizer"])
    parser.add_argument("--results", default=None, help="Append each row as a JSON line to this file.")
    parser.add_argument("--data", help="sync: a prepared DATA_DIR.")
    parser.add_argument("--case", action="append", default=[], help="sync: CONFIG:OPTIMIZER (repeatable).")
    parser.add_argument("--set", action="append", default=[], help="sync: a config override (repeatable).")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="sync: counted steps (the first one apart).")
    parser.add_argument("--mixed-precision", default="auto")
    parser.add_argument("--config", default="bert_base", help="optimizer: the shipped config's parameters.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.check == "sync":
        cases = [(lambda c=case, u=unpad: sync_case(*c.split(":"), u, args), f"{case}, unpad {unpad}")
                 for case in args.case for unpad in ("false", "true")]
    else:
        cases = [(lambda: optimizer_case(args), args.config)]
    failed = False
    for run, name in cases:
        try:
            row = run()
        except Exception as error:  # the other cases still run; the suite reports this one as failed
            traceback.print_exc()
            row, failed = dict(case=name, error=f"{type(error).__name__}: {error}"[:300]), True
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        if args.results:
            with open(args.results, "a") as handle:
                handle.write(json.dumps(row) + "\n")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

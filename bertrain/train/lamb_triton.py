"""LAMB's GPU kernel in Triton: lamb_native.c's two passes over memory (10 tensor-sized reads and writes; lamb.py's
torch ops need 16 on a GPU) over all of a group's tensors in one launch each, with a small launch between them
for the trust ratios. Triton ships with torch's CUDA builds; without it lamb.py uses torch ops. The CPU tests run
these kernels in Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: eligible() is False and nothing here is called
    triton = tl = None

BLOCK = 4096  # elements per program of the two passes: each writes one partial sum of squares per norm
RATIO_BLOCK = 1024  # partial sums a trust-ratio program adds at a time


def _jit(function):
    return function if triton is None else triton.jit(function)


def eligible(tensors: list[torch.Tensor]) -> bool:
    """Dense, contiguous float32 tensors on one CUDA device (or the CPU under Triton's interpreter)."""
    device = tensors[0].device
    interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and (device.type == "cuda" or interpreted)
            and all(t.device == device and t.dtype == torch.float32 and t.is_contiguous() and t.layout == torch.strided
                    for t in tensors))


_builds: dict[torch.device, bool] = {}


def builds(device: torch.device) -> bool:
    """Whether the kernels compile and run on `device`: tried once, on scratch tensors, so that a Triton version
    they do not suit costs a warning and the torch ops' speed, not a training run."""
    if device not in _builds:
        try:
            params, grads, exp_avgs, exp_avg_sqs = ([torch.rand(n, device=device) for n in (5, BLOCK + 3)]
                                                    for _ in range(4))
            steps = [torch.ones((), device=device) for _ in params]
            lamb_update(params, grads, exp_avgs, exp_avg_sqs, steps, 1e-3, 0.9, 0.999, 1e-6, 0.01, None)
            _builds[device] = True
        except Exception as error:  # noqa: BLE001 - Triton's compile errors have no common type
            warnings.warn(f"LAMB: the Triton kernel did not build on {device} ({type(error).__name__}: {error}); "
                          "the optimizer step uses torch ops (about 2x slower).", RuntimeWarning, stacklevel=4)
            _builds[device] = False
    return _builds[device]


def lamb_update(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, found_inf: torch.Tensor | None) -> None:
    """One LAMB update (steps already counted), as lamb_native.lamb_update; no host read of a device value."""
    device = params[0].device
    chunk_tensor, chunk_start, numels, first_chunk, chunk_count = _layout(device, tuple(p.numel() for p in params))
    addresses = _addresses(device, grads, exp_avgs, exp_avg_sqs, params)
    corrections = bias_corrections(steps, beta1, beta2)
    if found_inf is None:
        found_inf = torch.zeros((), dtype=torch.float32, device=device)
    chunks = chunk_tensor.numel()
    partials = torch.empty(chunks, 2, dtype=torch.float32, device=device)
    scales = torch.empty(len(params), dtype=torch.float32, device=device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _moments_and_squares[(chunks,)](addresses, chunk_tensor, chunk_start, numels, corrections, found_inf,
                                        partials, 1.0 - beta1, beta2, 1.0 - beta2, eps, weight_decay,
                                        BLOCK=BLOCK, num_warps=8)
        _trust_ratios[(len(params),)](partials, first_chunk, chunk_count, scales, lr, BLOCK=RATIO_BLOCK)
        _apply[(chunks,)](addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps,
                          weight_decay, BLOCK=BLOCK, num_warps=8)


def bias_corrections(steps: list[torch.Tensor], beta1: float, beta2: float) -> torch.Tensor:
    """[tensors, 2] float32: 1 / (1 - beta1^t) and 1 / sqrt(1 - beta2^t), computed in float64 on the device as
    lamb_native.c does (in float32, 1 - 0.999^t loses 3e-5 of its value)."""
    counts = torch.stack(steps).to(torch.float64)
    step_size = 1.0 / (1.0 - torch.pow(beta1, counts))
    inverse_bc2_sqrt = torch.rsqrt(1.0 - torch.pow(beta2, counts))
    return torch.stack([step_size, inverse_bc2_sqrt], dim=1).to(torch.float32)


_layouts: dict[tuple, tuple[torch.Tensor, ...]] = {}
_address_tables: dict[tuple[int, ...], torch.Tensor] = {}  # the last few, newest last
KEPT_ADDRESS_TABLES = 8  # a few optimizers' groups


def _layout(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Each program's tensor and first element, and each tensor's size, first program and program count (int64):
    built once per list of sizes."""
    key = (device, sizes, BLOCK)
    if key not in _layouts:
        chunk_tensor, chunk_start, first_chunk, chunk_count = [], [], [], []
        for tensor, size in enumerate(sizes):
            first_chunk.append(len(chunk_tensor))
            starts = range(0, size, BLOCK)
            chunk_tensor += [tensor] * len(starts)
            chunk_start += starts
            chunk_count.append(len(starts))
        _layouts[key] = tuple(_to_device(values, device)
                              for values in (chunk_tensor, chunk_start, sizes, first_chunk, chunk_count))
    return _layouts[key]


def _addresses(device: torch.device, *tensor_lists: list[torch.Tensor]) -> torch.Tensor:
    """[tensors, 4] int64 device table of grad, exp_avg, exp_avg_sq and param addresses. Gradients can move
    between steps: a table is reused only for the same addresses."""
    values = tuple(t.data_ptr() for tensors in zip(*tensor_lists) for t in tensors)
    table = _address_tables.pop(values, None)
    if table is None:
        table = _to_device(values, device)
        while len(_address_tables) >= KEPT_ADDRESS_TABLES:
            _address_tables.pop(next(iter(_address_tables)))
    _address_tables[values] = table
    return table


def _to_device(values, device: torch.device) -> torch.Tensor:
    """int64 values on the device, copied from pinned memory: no host wait."""
    table = torch.tensor(values, dtype=torch.int64)
    return table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table


@_jit
def _block(chunk_tensor, chunk_start, numels, found_inf, BLOCK: tl.constexpr):
    """This program's block: (program, its tensor, element offsets, which are inside the tensor, which to write:
    none after a non-finite step)."""
    chunk = tl.program_id(0)
    tensor = tl.load(chunk_tensor + chunk)
    offsets = tl.load(chunk_start + chunk) + tl.arange(0, BLOCK)
    numel = tl.load(numels + tensor)
    return chunk, tensor, offsets, offsets < numel, offsets < tl.where(tl.load(found_inf) == 0, numel, 0)


@_jit
def _moment_and_param_addresses(addresses, tensor):
    """The tensor's exp_avg, exp_avg_sq and param pointers from its row of the address table."""
    return (tl.load(addresses + 4 * tensor + 1).to(tl.pointer_type(tl.float32)),
            tl.load(addresses + 4 * tensor + 2).to(tl.pointer_type(tl.float32)),
            tl.load(addresses + 4 * tensor + 3).to(tl.pointer_type(tl.float32)))


@_jit
def _update(m, v, w, corrections, tensor, eps, weight_decay):
    """LAMB's update before the trust ratio, m̂ / (sqrt(v̂) + eps) + weight_decay * w: one definition for both
    passes, so that pass 2 applies exactly the update whose norm pass 1 measured."""
    step_size = tl.load(corrections + 2 * tensor)
    inverse_bc2_sqrt = tl.load(corrections + 2 * tensor + 1)
    return tl.div_rn(m * step_size, tl.sqrt_rn(v) * inverse_bc2_sqrt + eps) + weight_decay * w


@_jit
def _moments_and_squares(addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, partials,
                         one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK: tl.constexpr):
    """Pass 1, one program per BLOCK elements: new moments (kept where found_inf is 0) and the block's sums of
    w^2 and update^2."""
    chunk, tensor, offsets, inside, keep = _block(chunk_tensor, chunk_start, numels, found_inf, BLOCK)
    exp_avg, exp_avg_sq, param = _moment_and_param_addresses(addresses, tensor)
    grad = tl.load(addresses + 4 * tensor).to(tl.pointer_type(tl.float32))
    g = tl.load(grad + offsets, mask=inside, other=0.0)
    m = tl.load(exp_avg + offsets, mask=inside, other=0.0)
    v = tl.load(exp_avg_sq + offsets, mask=inside, other=0.0)
    w = tl.load(param + offsets, mask=inside, other=0.0)
    m = m + one_minus_beta1 * (g - m)
    v = beta2 * v + one_minus_beta2 * g * g
    tl.store(exp_avg + offsets, m, mask=keep)
    tl.store(exp_avg_sq + offsets, v, mask=keep)
    update = _update(m, v, w, corrections, tensor, eps, weight_decay)
    tl.store(partials + 2 * chunk, tl.sum(w * w, axis=0))
    tl.store(partials + 2 * chunk + 1, tl.sum(update * update, axis=0))


@_jit
def _trust_ratios(partials, first_chunk, chunk_count, scales, lr, BLOCK: tl.constexpr):
    """One program per tensor: its blocks' sums in a fixed order (float64; deterministic), then
    scale = lr * ||w|| / ||update|| (lr where a norm is 0)."""
    tensor = tl.program_id(0)
    first = tl.load(first_chunk + tensor)
    count = tl.load(chunk_count + tensor)
    weight_squares = tl.zeros([BLOCK], dtype=tl.float64)
    update_squares = tl.zeros([BLOCK], dtype=tl.float64)
    offset = 0
    while offset < count:  # not range(): Triton's interpreter takes only constant bounds there
        index = offset + tl.arange(0, BLOCK)
        inside = index < count
        weight_squares += tl.load(partials + 2 * (first + index), mask=inside, other=0.0).to(tl.float64)
        update_squares += tl.load(partials + 2 * (first + index) + 1, mask=inside, other=0.0).to(tl.float64)
        offset += BLOCK
    weight_norm = tl.sqrt(tl.sum(weight_squares, axis=0))
    update_norm = tl.sqrt(tl.sum(update_squares, axis=0))
    ratio = tl.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
    tl.store(scales + tensor, (lr * ratio).to(tl.float32))


@_jit
def _apply(addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps, weight_decay,
           BLOCK: tl.constexpr):
    """Pass 2: the update again from the new moments, w -= scale * update (nothing where found_inf is 1)."""
    chunk, tensor, offsets, inside, keep = _block(chunk_tensor, chunk_start, numels, found_inf, BLOCK)
    exp_avg, exp_avg_sq, param = _moment_and_param_addresses(addresses, tensor)
    m = tl.load(exp_avg + offsets, mask=keep, other=0.0)
    v = tl.load(exp_avg_sq + offsets, mask=keep, other=0.0)
    w = tl.load(param + offsets, mask=keep, other=0.0)
    update = _update(m, v, w, corrections, tensor, eps, weight_decay)
    tl.store(param + offsets, w - tl.load(scales + tensor) * update, mask=keep)

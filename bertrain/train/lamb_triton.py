"""LAMB's GPU kernel in Triton: lamb_native.c's two passes over memory (10 tensor-sized reads and writes; lamb.py's
torch ops need 16 on a GPU) over all of a group's tensors in one launch each, with a small launch between them
for the trust ratios; or, SCHEDULE "pipelined", both passes in one launch, each group of tensors' pass 2 read
from L2 right after its pass 1 (an experiment until measured on a GPU: benchmarks/lamb_kernels.py).
Triton ships with torch's CUDA builds; without it lamb.py uses torch ops. The CPU tests run these kernels in
Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import contextlib
import itertools
import os

import torch

from bertrain.errors import UsageError
from bertrain.kernel_trial import tried_once

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: eligible() is False and nothing here is called
    triton = tl = None

# elements and warps per program of the two passes (each program writes one partial sum of squares per norm): the
# fastest of benchmarks/lamb_kernels.py's sweep on an H200 (bert_base, device time 1.18x fused AdamW's; 4096 x 8,
# whose pass 1 takes 184 registers a thread and so runs one program per multiprocessor, 1.49x)
BLOCK = 1024
NUM_WARPS = 4
RATIO_BLOCK = 1024  # partial sums a trust-ratio program adds at a time
SCHEDULES = ("two_pass", "pipelined")
SCHEDULE = os.environ.get("BERTRAIN_LAMB_SCHEDULE", "two_pass")  # the pipelined one: not yet the default, see above
# pipelined: exp_avg + exp_avg_sq + weight bytes per group (L2: 50 MB on an H100 or H200; about two groups are in
# flight, the gradients stream past), and programs per multiprocessor (the items go to whichever is free)
GROUP_BYTES = 8 * 2**20
PROGRAMS_PER_SM = 4
ITEM_BLOCKS = 4  # blocks a program takes at a time: the counter updates and the wait are paid once an item
FP_FUSION = dict(enable_fp_fusion=True)  # FMAs, as measured: Triton 3.10 turns them off by default (3.9 warns)


def _jit(function):
    return function if triton is None else triton.jit(function)


def eligible(tensors: list[torch.Tensor]) -> bool:
    """Dense, contiguous float32 tensors on one CUDA device (or the CPU under Triton's interpreter)."""
    device = tensors[0].device
    interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and (device.type == "cuda" or interpreted)
            and all(t.device == device and t.dtype == torch.float32 and t.is_contiguous() and t.layout == torch.strided
                    for t in tensors))


_builds: dict[tuple, bool] = {}


def builds(device: torch.device) -> bool:
    """Whether the kernels of SCHEDULE, BLOCK and NUM_WARPS compile and run on `device`: tried once, on scratch
    tensors, so that a Triton version they do not suit costs a warning and the torch ops' speed, not a training
    run."""
    if SCHEDULE not in SCHEDULES:
        raise UsageError(f"BERTRAIN_LAMB_SCHEDULE={SCHEDULE!r} is not a schedule of LAMB's GPU kernel: set "
                         f"{' or '.join(SCHEDULES)}, or unset it (two_pass).")

    def trial() -> None:
        params, grads, exp_avgs, exp_avg_sqs = ([torch.linspace(0.1, 1.0, n, device=device) for n in (5, BLOCK + 3)]
                                                for _ in range(4))
        steps = [torch.ones((), device=device) for _ in params]
        lamb_update(params, grads, exp_avgs, exp_avg_sqs, steps, 1e-3, 0.9, 0.999, 1e-6, 0.01, None)

    return tried_once(_builds, (device, SCHEDULE, BLOCK, NUM_WARPS), device, trial, lambda error: (
        f"LAMB: the Triton kernel did not build on {device} ({type(error).__name__}: {error}); the optimizer step "
        "uses torch ops (about 2x slower)."), stacklevel=5)


def lamb_update(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, found_inf: torch.Tensor | None,
                grad_scale: torch.Tensor | None = None, addresses: torch.Tensor | None = None) -> None:
    """One LAMB update, as lamb_native.lamb_update except that a kernel counts the steps (float32 scalars, where
    found_inf is 0) and computes their bias corrections: no host read of a device value, and none of the host time
    of torch ops over a list of scalars. `addresses`: address_table's, in place of `grads` (then unused)."""
    device, sizes = params[0].device, tuple(p.numel() for p in params)
    chunk_tensor, chunk_start, numels, first_chunk, chunk_count = _layout(device, sizes)
    if addresses is None:
        addresses = address_table(device, [g.data_ptr() for g in grads], [
            tuple(t.data_ptr() for t in tensors) for tensors in zip(exp_avgs, exp_avg_sqs, params, steps)])
    corrections = torch.empty(len(params), 2, dtype=torch.float32, device=device)
    found_inf = torch.zeros((), dtype=torch.float32, device=device) if found_inf is None else found_inf
    grad_scale = _one(device) if grad_scale is None else grad_scale  # each gradient as it is (divided by 1)
    chunks = chunk_tensor.numel()
    partials = torch.empty(chunks, 2, dtype=torch.float32, device=device)
    scales = torch.empty(len(params), dtype=torch.float32, device=device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _count_steps[(len(params),)](addresses, _betas(device, beta1, beta2), found_inf, corrections, num_warps=1,
                                     **FP_FUSION)
        if SCHEDULE == "pipelined":
            items, item_blocks, tensor_group, group_tensors = _pipeline(device, sizes, GROUP_BYTES)
            counters = torch.zeros(1 + len(params) + group_tensors.numel(), dtype=torch.int32, device=device)
            _pipelined[(min(items.numel(), _programs(device)),)](
                addresses, items, item_blocks, items.numel(), chunk_tensor, chunk_start, numels, first_chunk,
                chunk_count, tensor_group, group_tensors, counters, len(params), corrections, found_inf, grad_scale,
                partials, scales, lr, 1.0 - beta1, beta2, 1.0 - beta2, eps, weight_decay, BLOCK=BLOCK,
                RATIO_BLOCK=RATIO_BLOCK, num_warps=NUM_WARPS, **FP_FUSION)
            return
        _moments_and_squares[(chunks,)](addresses, chunk_tensor, chunk_start, numels, corrections, found_inf,
                                        grad_scale, partials, 1.0 - beta1, beta2, 1.0 - beta2, eps, weight_decay,
                                        BLOCK=BLOCK, num_warps=NUM_WARPS, **FP_FUSION)
        _trust_ratios[(len(params),)](partials, first_chunk, chunk_count, scales, lr, RATIO_BLOCK=RATIO_BLOCK,
                                      **FP_FUSION)
        _apply[(chunks,)](addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps,
                          weight_decay, BLOCK=BLOCK, num_warps=NUM_WARPS, **FP_FUSION)


_layouts: dict[tuple, tuple[torch.Tensor, ...]] = {}
_address_tables: dict[tuple[int, ...], torch.Tensor] = {}  # the last few, newest last
KEPT_ADDRESS_TABLES = 8  # a few optimizers' groups


def _layout(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Each program's tensor and first element, and each tensor's size, first program and program count (int64):
    built once per list of sizes."""
    key = (device, sizes, BLOCK)
    if key not in _layouts:
        chunk_count = _block_counts(sizes)
        first_chunk = list(itertools.accumulate(chunk_count, initial=0))[:-1]
        chunk_tensor = [tensor for tensor, count in enumerate(chunk_count) for _ in range(count)]
        chunk_start = [start for count in chunk_count for start in range(0, count * BLOCK, BLOCK)]
        _layouts[key] = tuple(_to_device(values, device)
                              for values in (chunk_tensor, chunk_start, sizes, first_chunk, chunk_count))
    return _layouts[key]


def _block_counts(sizes: tuple[int, ...]) -> list[int]:
    """Blocks per tensor; an empty tensor gets one (nothing to write), so that both schedules treat it as any
    other."""
    return [max(1, -(-size // BLOCK)) for size in sizes]


def _pipeline(device: torch.device, sizes: tuple[int, ...], group_bytes: int) -> tuple[torch.Tensor, ...]:
    """The pipelined schedule, built once per list of sizes (int64): its items in order (first block * 2 + pass,
    pass 0 or 1) and their block counts (up to ITEM_BLOCKS consecutive blocks of one tensor), each tensor's group,
    each group's tensor count. Groups are whole tensors, closed once their state reaches group_bytes; each group's
    pass 1 comes one group ahead of its pass 2, so that no pass-2 item waits for a pass-1 item taken just before."""
    key = (device, sizes, BLOCK, group_bytes, ITEM_BLOCKS)
    if key not in _layouts:
        groups, group, filled = [], [], 0
        for tensor, size in enumerate(sizes):
            group.append(tensor)
            filled += 12 * size  # exp_avg, exp_avg_sq and the weight, float32
            if filled >= group_bytes:
                groups.append(group)
                group, filled = [], 0
        groups += [group] if group else []
        first = list(itertools.accumulate(_block_counts(sizes), initial=0))
        runs = [[(start, min(ITEM_BLOCKS, first[tensor + 1] - start)) for tensor in group
                 for start in range(first[tensor], first[tensor + 1], ITEM_BLOCKS)] for group in groups]
        order = []  # (group, pass)
        for index in range(len(groups)):
            order += [(index, 0)] + ([(index - 1, 1)] if index > 0 else [])
        order += [(len(groups) - 1, 1)] if groups else []
        items = [(2 * start + kind, count) for index, kind in order for start, count in runs[index]]
        tensor_group = [0] * len(sizes)
        for index, group in enumerate(groups):
            for tensor in group:
                tensor_group[tensor] = index
        _layouts[key] = tuple(_to_device(values, device) for values in (
            [code for code, _ in items], [count for _, count in items], tensor_group, [len(g) for g in groups]))
    return _layouts[key]


def _programs(device: torch.device) -> int:
    """The pipelined kernel's grid: PROGRAMS_PER_SM per multiprocessor (4 in Triton's interpreter)."""
    if device.type != "cuda":
        return 4
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def address_table(device: torch.device, grads: list[int], states: list[tuple[int, ...]]) -> torch.Tensor:
    """[tensors, 5] int64 device table of grad, exp_avg, exp_avg_sq, param and step addresses, from the gradients'
    and each tensor's (exp_avg, exp_avg_sq, param, step) ones (Lamb keeps those between steps, and gives a
    row-blocked gradient's blocks as offsets, not views). Gradients can move between steps: a table is reused only
    for the same addresses."""
    values = tuple(itertools.chain.from_iterable((grad, *state) for grad, state in zip(grads, states)))
    table = _address_tables.pop(values, None)
    if table is None:
        table = _to_device(values, device)
        while len(_address_tables) >= KEPT_ADDRESS_TABLES:
            _address_tables.pop(next(iter(_address_tables)))
    _address_tables[values] = table
    return table


_ones: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    """A float32 1 on the device, made once (the grad_scale of an unclipped step)."""
    if device not in _ones:
        _ones[device] = torch.ones((), dtype=torch.float32, device=device)
    return _ones[device]


_betas_on_device: dict[tuple, torch.Tensor] = {}


def _betas(device: torch.device, beta1: float, beta2: float) -> torch.Tensor:
    """[beta1, beta2] in float64 on the device, made once per value (Triton takes a float argument as float32)."""
    key = (device, beta1, beta2)
    if key not in _betas_on_device:
        _betas_on_device[key] = _to_device([beta1, beta2], device, torch.float64)
    return _betas_on_device[key]


def _to_device(values, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Values (int64 unless said) on the device, copied from pinned memory: no host wait."""
    table = torch.tensor(values, dtype=dtype)
    return table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table


@_jit
def _block(chunk, chunk_tensor, chunk_start, numels, found_inf, BLOCK: tl.constexpr):
    """A block's tensor, element offsets, which are inside the tensor, which to write (none after a non-finite
    step)."""
    tensor = tl.load(chunk_tensor + chunk)
    offsets = tl.load(chunk_start + chunk) + tl.arange(0, BLOCK)
    numel = tl.load(numels + tensor)
    return tensor, offsets, offsets < numel, offsets < tl.where(tl.load(found_inf) == 0, numel, 0)


@_jit
def _address(addresses, tensor, column: tl.constexpr):
    """The tensor's grad (0), exp_avg (1), exp_avg_sq (2), param (3) or step (4) pointer from the address table."""
    return tl.load(addresses + 5 * tensor + column).to(tl.pointer_type(tl.float32))


@_jit
def _moment_and_param_addresses(addresses, tensor):
    """The tensor's exp_avg, exp_avg_sq and param pointers."""
    return _address(addresses, tensor, 1), _address(addresses, tensor, 2), _address(addresses, tensor, 3)


@_jit
def _power(base, exponent):
    """base^exponent (float64, exponent an integer >= 0) by repeated squaring: Triton has no float64 pow on every
    backend, and its interpreter runs this too."""
    result = base * 0.0 + 1.0
    while exponent > 0:
        result = tl.where(exponent % 2 == 1, result * base, result)
        base = base * base
        exponent = exponent // 2
    return result


@_jit
def _count_steps(addresses, betas, found_inf, corrections):
    """Before the passes, one program per tensor: Adam's bias corrections at the new step t, 1 / (1 - beta1^t) and
    1 / sqrt(1 - beta2^t), in float64 as lamb_native.c (in float32, 1 - 0.999^t loses 3e-5 of its value), then
    float32; and the step counted where found_inf is 0."""
    tensor = tl.program_id(0)
    step = _address(addresses, tensor, 4)
    count = tl.load(step) + 1.0
    exponent = count.to(tl.int64)
    tl.store(corrections + 2 * tensor, (1.0 / (1.0 - _power(tl.load(betas), exponent))).to(tl.float32))
    tl.store(corrections + 2 * tensor + 1, (1.0 / tl.sqrt(1.0 - _power(tl.load(betas + 1), exponent))).to(tl.float32))
    tl.store(step, tl.where(tl.load(found_inf) == 0, count, count - 1.0))


@_jit
def _update(m, v, w, corrections, tensor, eps, weight_decay):
    """LAMB's update before the trust ratio, m̂ / (sqrt(v̂) + eps) + weight_decay * w: one definition for both
    passes, so that pass 2 applies exactly the update whose norm pass 1 measured."""
    step_size = tl.load(corrections + 2 * tensor)
    inverse_bc2_sqrt = tl.load(corrections + 2 * tensor + 1)
    return tl.div_rn(m * step_size, tl.sqrt_rn(v) * inverse_bc2_sqrt + eps) + weight_decay * w


@_jit
def _pass_one(chunk, addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, grad_scale, partials,
              one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK: tl.constexpr):
    """Pass 1 of one block: new moments (kept where found_inf is 0) from the gradients divided by grad_scale (the
    clipping) and the block's sums of w^2 and update^2. Returns the block's tensor."""
    tensor, offsets, inside, keep = _block(chunk, chunk_tensor, chunk_start, numels, found_inf, BLOCK)
    exp_avg, exp_avg_sq, param = _moment_and_param_addresses(addresses, tensor)
    grad = _address(addresses, tensor, 0)
    g = tl.load(grad + offsets, mask=inside, other=0.0, eviction_policy="evict_first")  # not read again
    scale = tl.load(grad_scale)
    if scale != 1.0:  # clipped: divided as torch's fused Adam divides (unclipped steps skip the division's work)
        g = tl.div_rn(g, scale)
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
    return tensor


@_jit
def _scale(tensor, partials, first_chunk, chunk_count, scales, lr, RATIO_BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """The tensor's blocks' sums in a fixed order (float64; deterministic), then
    scale = lr * ||w|| / ||update|| (lr where a norm is 0)."""
    first = tl.load(first_chunk + tensor)
    count = tl.load(chunk_count + tensor)
    weight_squares = tl.zeros([RATIO_BLOCK], dtype=tl.float64)
    update_squares = tl.zeros([RATIO_BLOCK], dtype=tl.float64)
    offset = 0
    while offset < count:  # not range(): Triton's interpreter takes only constant bounds there
        index = offset + tl.arange(0, RATIO_BLOCK)
        inside = index < count
        weight_squares += tl.load(partials + 2 * (first + index), mask=inside, other=0.0,
                                  cache_modifier=CACHE).to(tl.float64)
        update_squares += tl.load(partials + 2 * (first + index) + 1, mask=inside, other=0.0,
                                  cache_modifier=CACHE).to(tl.float64)
        offset += RATIO_BLOCK
    weight_norm = tl.sqrt(tl.sum(weight_squares, axis=0))
    update_norm = tl.sqrt(tl.sum(update_squares, axis=0))
    ratio = tl.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
    tl.store(scales + tensor, (lr * ratio).to(tl.float32))


@_jit
def _pass_two(chunk, addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps, weight_decay,
              BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """Pass 2 of one block: the update again from the new moments, w -= scale * update (nothing where found_inf
    is 1)."""
    tensor, offsets, inside, keep = _block(chunk, chunk_tensor, chunk_start, numels, found_inf, BLOCK)
    exp_avg, exp_avg_sq, param = _moment_and_param_addresses(addresses, tensor)
    m = tl.load(exp_avg + offsets, mask=keep, other=0.0, cache_modifier=CACHE)
    v = tl.load(exp_avg_sq + offsets, mask=keep, other=0.0, cache_modifier=CACHE)
    w = tl.load(param + offsets, mask=keep, other=0.0, cache_modifier=CACHE)
    update = _update(m, v, w, corrections, tensor, eps, weight_decay)
    tl.store(param + offsets, w - tl.load(scales + tensor, cache_modifier=CACHE) * update, mask=keep)


@_jit
def _moments_and_squares(addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, grad_scale, partials,
                         one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK: tl.constexpr):
    """Pass 1, one program per block."""
    _pass_one(tl.program_id(0), addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, grad_scale,
              partials, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK)


@_jit
def _trust_ratios(partials, first_chunk, chunk_count, scales, lr, RATIO_BLOCK: tl.constexpr):
    """Between the passes, one program per tensor: its scale."""
    _scale(tl.program_id(0), partials, first_chunk, chunk_count, scales, lr, RATIO_BLOCK, "")


@_jit
def _apply(addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps, weight_decay,
           BLOCK: tl.constexpr):
    """Pass 2, one program per block."""
    _pass_two(tl.program_id(0), addresses, chunk_tensor, chunk_start, numels, corrections, found_inf, scales, eps,
              weight_decay, BLOCK, "")


@_jit
def _pipelined(addresses, items, item_blocks, item_count, chunk_tensor, chunk_start, numels, first_chunk,
               chunk_count, tensor_group, group_tensors, counters, tensor_count, corrections, found_inf, grad_scale,
               partials, scales, lr, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK: tl.constexpr,
               RATIO_BLOCK: tl.constexpr):
    """Both passes in one launch: each program takes the schedule's next item (a few blocks' pass 1 or pass 2)
    until none is left. A tensor's last pass-1 item computes its scale; a pass-2 item waits until every tensor
    of its group has one. Items are taken in order, so every item waited for is held by a running program: no
    deadlock whatever the grid or the GPU's occupancy. Pass 2 reads through L2 only (".cg"): pass 1 wrote from
    other SMs."""
    chunks_done = counters + 1                   # per tensor: its pass-1 blocks finished
    scales_done = counters + 1 + tensor_count    # per group: its tensors whose scale is written
    item = tl.atomic_add(counters, 1)
    while item < item_count:
        code = tl.load(items + item)
        count = tl.load(item_blocks + item)
        first = code // 2
        tensor = tl.load(chunk_tensor + first)
        block = 0
        if code % 2 == 0:
            while block < count:
                _pass_one(first + block, addresses, chunk_tensor, chunk_start, numels, corrections, found_inf,
                          grad_scale, partials, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, BLOCK)
                block += 1
            tl.debug_barrier()  # every thread's stores before the count that publishes them
            if tl.atomic_add(chunks_done + tensor, count, sem="acq_rel") == tl.load(chunk_count + tensor) - count:
                tl.debug_barrier()
                _scale(tensor, partials, first_chunk, chunk_count, scales, lr, RATIO_BLOCK, ".cg")
                tl.debug_barrier()
                tl.atomic_add(scales_done + tl.load(tensor_group + tensor), 1, sem="release")
        else:
            group = tl.load(tensor_group + tensor)
            while tl.atomic_add(scales_done + group, 0, sem="acquire") < tl.load(group_tensors + group):
                pass
            tl.debug_barrier()
            while block < count:
                _pass_two(first + block, addresses, chunk_tensor, chunk_start, numels, corrections, found_inf,
                          scales, eps, weight_decay, BLOCK, ".cg")
                block += 1
        item = tl.atomic_add(counters, 1)

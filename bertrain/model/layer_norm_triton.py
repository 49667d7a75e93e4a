"""LayerNorm's forward and backward as Triton kernels, for the half-precision residual stream on a GPU; in the encoder
layers each with its sublayer's residual add and dropout (flash-attn's dropout_add_layer_norm: one pass where torch
runs three kernels, dropout's mask drawn again in the backward instead of stored). torch's LayerNorm backward took
5.45 ms of bert-large's 75.6 ms step on an H200 (49 LayerNorms of [16384, 1024] bf16, about four times what their
bytes need), its dropout 2.3 ms; here each backward program walks a block of rows and keeps its weight and bias
gradient sums in registers. An experiment until measured on a GPU (`benchmarks/gpu_step.py --triton-layer-norm`):
chosen by BERTRAIN_LAYER_NORM=triton, else torch's (`BERTRAIN_LAYER_NORM=triton benchmarks/gpu_profile.py` counts
the kernels, named *_layer_norm_*, as normalization). Its dropout draws from Triton's Philox, seeded from torch's
generator, so its masks are not torch's: reproducible and resumed exactly, but another stream than the default's.
The CPU tests run the kernels in Triton's interpreter."""

from __future__ import annotations

import functools
import os

import torch

from bertrain.errors import UsageError
from bertrain.kernel_trial import tried_once

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: eligible() is False and nothing here is called
    triton = tl = None

KERNELS = ("torch", "triton")
MAX_WIDTH = 8192  # a row in one program's registers
# 4: at BERT's widths the backward takes at most 104 registers a thread (sm_90, 4 warps; 128 with dropout), so four
# programs fit a multiprocessor's 64K registers and keep 16 warps in flight (tests/test_layer_norm_triton.py checks it)
BACKWARD_PROGRAMS_PER_SM = 4


def _jit(function):
    return function if triton is None else triton.jit(function)


@_jit
def _kept(SEED, row, p, BLOCK: tl.constexpr):
    """Which of a row's BLOCK positions dropout keeps (probability 1 - p): Philox from the call's seed, four draws
    per counter (one rand4x call where rand makes one), position 4j + i from draw i of counter row * BLOCK/4 + j."""
    counters = row * (BLOCK // 4) + tl.arange(0, BLOCK // 4)
    u0, u1, u2, u3 = tl.rand4x(tl.load(SEED), counters)
    return tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), [BLOCK]) >= p  # join interleaves: 0, 1, 2, 3


@_jit
def _layer_norm_forward(X, RESIDUAL, SEED, W, B, Y, H, STATS, rows, width, p, eps, ADD: tl.constexpr,
                        DROPOUT: tl.constexpr, BLOCK: tl.constexpr):
    """One row: y = (h - mean) * rstd * w + b, statistics in float32 (kept for the backward: the rows' means, then
    their rstd, in STATS), where h = x, or with ADD h = residual + dropout(x), rounded to x's dtype and stored in H
    for the backward."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(X + row * width + cols, mask=inside, other=0.0).to(tl.float32)
    if ADD:
        if DROPOUT:
            x = tl.where(_kept(SEED, row, p, BLOCK), x * (1.0 / (1.0 - p)), 0.0)
        x = tl.load(RESIDUAL + row * width + cols, mask=inside, other=0.0).to(tl.float32) + x
        x = x.to(H.dtype.element_ty)
        tl.store(H + row * width + cols, x, mask=inside)
        x = x.to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    centered = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / width + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * width + cols, (centered * rstd * w + b).to(Y.dtype.element_ty), mask=inside)
    tl.store(STATS + row, mean)
    tl.store(STATS + rows + row, rstd)


@_jit
def _layer_norm_backward(DY, X, SEED, W, STATS, DX, DDROPPED, PARTIALS, rows, width, rows_per_program, p,
                         DROPOUT: tl.constexpr, BLOCK: tl.constexpr):
    """A block of rows: dx = rstd * (w*dy - mean(w*dy) - x̂ * mean(x̂ * w*dy)); this block's sums of dy * x̂ (the
    weight's gradient) and dy (the bias's) written as rows of PARTIALS [2, programs, width]. DROPOUT: also the
    gradient of dropout's input, dx / (1 - p) where the forward kept a position (the same draws, from the same
    seed), else 0."""
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    first = program.to(tl.int64) * rows_per_program  # 64-bit offsets: rows x width may pass 2**31
    last = tl.minimum(first + rows_per_program, rows)
    for row in range(first, last):
        offsets = row * width + cols
        x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.load(STATS + rows + row)
        x_hat = tl.where(inside, (x - tl.load(STATS + row)) * rstd, 0.0)
        w_dy = w * dy
        dx = (w_dy - tl.sum(w_dy, axis=0) / width - x_hat * (tl.sum(x_hat * w_dy, axis=0) / width)) * rstd
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=inside)
        if DROPOUT:
            dropped = tl.where(_kept(SEED, row, p, BLOCK), dx * (1.0 / (1.0 - p)), 0.0)
            tl.store(DDROPPED + offsets, dropped.to(DDROPPED.dtype.element_ty), mask=inside)
        dw += dy * x_hat
        db += dy
    tl.store(PARTIALS + program * width + cols, dw, mask=inside)
    tl.store(PARTIALS + (tl.num_programs(0) + program) * width + cols, db, mask=inside)


@functools.lru_cache(maxsize=None)
def launch_options(width: int) -> dict:
    """BLOCK (the row padded to a power of two, at least dropout's four draws) and warps: more warps for wider rows,
    as Triton's tutorial; FMAs on, as measured (Triton 3.10 turns them off by default). Cached: the Function's host
    time counts (a host-bound loop launches ~100 a step)."""
    block = max(1 << (width - 1).bit_length(), 4)
    return dict(BLOCK=block, num_warps=min(max(block // 256, 1), 8), enable_fp_fusion=True)


class TritonLayerNorm(torch.autograd.Function):
    """F.layer_norm over the last dimension through the two kernels, of x, or of residual + F.dropout(x, p) when a
    residual is given (the sum, the dropout and the LayerNorm in one pass; dropout's mask not stored but drawn again
    in the backward); x's dtype in and out. Few host ops (no views, one buffer per purpose): ~100 calls a step."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                residual: torch.Tensor | None = None, p: float = 0.0) -> torch.Tensor:
        x = x.contiguous()                                                # [..., N] as rows of N
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        y = torch.empty_like(x)
        stats = torch.empty(2 * rows, dtype=torch.float32, device=x.device)  # the rows' means, then their rstd
        ctx.added, ctx.p = residual is not None, p if residual is not None else 0.0
        if ctx.added:
            residual = residual.contiguous()
            summed = torch.empty_like(x)                                  # residual + dropout(x): the backward's input
        else:
            residual = summed = x  # not read: pointers for the kernel's unused arguments
        # dropout's seed from the device's generator, as F.dropout draws (a kernel, no sync): seeded runs and
        # resumed ones repeat their masks; activation checkpointing's recomputation restores the generator first
        seed = torch.randint(2**62, (1,), device=x.device) if ctx.p > 0 else None
        if rows:
            _layer_norm_forward[(rows,)](x, residual, stats if seed is None else seed, weight, bias, y, summed,
                                         stats, rows, width, ctx.p, eps, ADD=ctx.added, DROPOUT=ctx.p > 0,
                                         **launch_options(width))
        ctx.save_for_backward(summed, weight, stats, seed)
        ctx.bias_dtype = bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        summed, weight, stats, seed = ctx.saved_tensors
        width = summed.shape[-1]
        rows = stats.shape[0] // 2
        programs = max(1, min(rows, backward_programs(summed.device)))
        rows_per_program = -(-rows // programs)
        programs = -(-rows // rows_per_program) if rows else 1
        dx = torch.empty_like(summed)
        dropped = torch.empty_like(summed) if ctx.p > 0 else dx            # the gradient of dropout's input
        # every program writes its row of both: no zeroing; summed in one reduction, cast in one kernel
        partials = torch.empty(2, programs, width, dtype=torch.float32, device=summed.device)
        if rows:
            _layer_norm_backward[(programs,)](dy.contiguous(), summed, stats if seed is None else seed, weight, stats,
                                              dx, dropped, partials, rows, width, rows_per_program, ctx.p,
                                              DROPOUT=ctx.p > 0, **launch_options(width))
        else:
            partials.zero_()
        dw, db = partials.sum(1).to(weight.dtype)
        db = db if db.dtype == ctx.bias_dtype else db.to(ctx.bias_dtype)
        if not ctx.added:
            return dx, dw, db, None, None, None
        return dropped, dw, db, None, dx, None


_programs: dict[torch.device, int] = {}


def backward_programs(device: torch.device) -> int:
    """How many programs share the backward's rows: a few per multiprocessor, each adding its rows' gradient sums."""
    if device.type != "cuda":
        return 8  # the interpreter: several programs, so that the partial sums are exercised
    if device not in _programs:
        _programs[device] = BACKWARD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return _programs[device]


def chosen() -> str:
    """BERTRAIN_LAYER_NORM: torch (the default) or triton."""
    kernel = os.environ.get("BERTRAIN_LAYER_NORM", "torch")
    if kernel not in KERNELS:
        raise UsageError(f"BERTRAIN_LAYER_NORM={kernel!r}: use torch or triton (or leave it unset: torch)")
    return kernel


def eligible(x: torch.Tensor) -> bool:
    """Triton installed, and x on a CUDA device (or the CPU under Triton's interpreter), rows that fit one program,
    outside torch.compile (which fuses a LayerNorm itself)."""
    interpreted = x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and (x.is_cuda or interpreted) and 0 < x.shape[-1] <= MAX_WIDTH
            and not torch.compiler.is_compiling())


_builds: dict[str, bool] = {}


def builds(device: torch.device) -> bool:
    """Whether the kernels compile and run on `device`: tried once on a small input, so that a Triton version they do
    not suit costs a warning and torch's kernel, not a training run."""
    return tried_once(_builds, str(device), device, lambda: _trial(device), lambda error: (
        f"BERTRAIN_LAYER_NORM=triton: the Triton LayerNorm kernels failed on {device} ({type(error).__name__}: "
        f"{error}); using torch's."), stacklevel=3)


def _trial(device: torch.device) -> None:
    """Both kernels once in each of their variants (LayerNorm; with the residual; with it and dropout), small."""
    x = torch.arange(120.0, device=device).reshape(3, 40).requires_grad_()
    weight, bias = torch.ones(40, device=device), torch.zeros(40, device=device)
    for residual, p in ((None, 0.0), (x, 0.0), (x, 0.5)):
        TritonLayerNorm.apply(x, weight, bias, 1e-5, residual, p).sum().backward()


def runs(x: torch.Tensor) -> bool:
    """Whether BERTRAIN_LAYER_NORM=triton chose the kernels and they run for x."""
    return chosen() == "triton" and eligible(x) and builds(x.device)


def layer_norm(x: torch.Tensor, shape, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """F.layer_norm, through the Triton kernels where BERTRAIN_LAYER_NORM=triton chooses them and they run."""
    if runs(x):
        return TritonLayerNorm.apply(x, weight, bias, eps)
    return torch.nn.functional.layer_norm(x, shape, weight, bias, eps)

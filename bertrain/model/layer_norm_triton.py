"""LayerNorm's forward and backward as Triton kernels, for the half-precision residual stream on a GPU. torch's
backward took 5.45 ms of bert-large's 75.6 ms step on an H200 (49 LayerNorms of [16384, 1024] bf16, about four times
what their bytes need); here each backward program walks a block of rows and keeps its weight and bias gradient
sums in registers. An experiment until measured on a GPU (`benchmarks/gpu_step.py --triton-layer-norm`): chosen
by BERTRAIN_LAYER_NORM=triton, else torch's (`BERTRAIN_LAYER_NORM=triton benchmarks/gpu_profile.py` counts the
kernels, named *_layer_norm_*, as normalization). The CPU tests run them in Triton's interpreter."""

from __future__ import annotations

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
# 4: at BERT's widths the backward takes at most 104 registers a thread (sm_90, 4 warps), so four programs fit a
# multiprocessor's 64K registers and keep 16 warps in flight (tests/test_layer_norm_triton.py checks it)
BACKWARD_PROGRAMS_PER_SM = 4


def _jit(function):
    return function if triton is None else triton.jit(function)


@_jit
def _layer_norm_forward(X, W, B, Y, MEAN, RSTD, width, eps, BLOCK: tl.constexpr):
    """One row: y = (x - mean) * rstd * w + b, statistics in float32 (kept for the backward)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < width
    x = tl.load(X + row * width + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    centered = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / width + eps)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * width + cols, (centered * rstd * w + b).to(Y.dtype.element_ty), mask=inside)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@_jit
def _layer_norm_backward(DY, X, W, MEAN, RSTD, DX, DW, DB, rows, width, rows_per_program, BLOCK: tl.constexpr):
    """A block of rows: dx = rstd * (w*dy - mean(w*dy) - x̂ * mean(x̂ * w*dy)); this block's sums of dy * x̂ (the
    weight's gradient) and dy (the bias's) written as one row of DW and DB."""
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
        rstd = tl.load(RSTD + row)
        x_hat = tl.where(inside, (x - tl.load(MEAN + row)) * rstd, 0.0)
        w_dy = w * dy
        dx = w_dy - tl.sum(w_dy, axis=0) / width - x_hat * (tl.sum(x_hat * w_dy, axis=0) / width)
        tl.store(DX + offsets, (dx * rstd).to(DX.dtype.element_ty), mask=inside)
        dw += dy * x_hat
        db += dy
    tl.store(DW + program * width + cols, dw, mask=inside)
    tl.store(DB + program * width + cols, db, mask=inside)


def launch_options(width: int) -> dict:
    """BLOCK (the row padded to a power of two) and warps: more warps for wider rows, as Triton's tutorial."""
    block = triton.next_power_of_2(width)
    return dict(BLOCK=block, num_warps=min(max(block // 256, 1), 8))


class TritonLayerNorm(torch.autograd.Function):
    """F.layer_norm over the last dimension through the two kernels; x's dtype in and out."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        width = x.shape[-1]
        rows_in = x.reshape(-1, width).contiguous()                       # [M, N]
        rows = rows_in.shape[0]
        y = torch.empty_like(rows_in)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        if rows:
            _layer_norm_forward[(rows,)](rows_in, weight, bias, y, mean, rstd, width, eps, **launch_options(width))
        ctx.save_for_backward(rows_in, weight, mean, rstd)
        ctx.bias_dtype = bias.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        rows_in, weight, mean, rstd = ctx.saved_tensors
        rows, width = rows_in.shape
        programs = max(1, min(rows, backward_programs(rows_in.device)))
        rows_per_program = -(-rows // programs)
        programs = -(-rows // rows_per_program) if rows else 1
        dx = torch.empty_like(rows_in)
        # every program writes its row of both: no zeroing; summed in one reduction, cast in one kernel
        partials = torch.empty(2, programs, width, dtype=torch.float32, device=rows_in.device)
        if rows:
            _layer_norm_backward[(programs,)](dy.reshape(-1, width).contiguous(), rows_in, weight, mean, rstd, dx,
                                              partials[0], partials[1], rows, width, rows_per_program,
                                              **launch_options(width))
        else:
            partials.zero_()
        dw, db = partials.sum(1).to(weight.dtype).unbind()
        return dx.view(dy.shape), dw, db.to(ctx.bias_dtype), None


def backward_programs(device: torch.device) -> int:
    """How many programs share the backward's rows: a few per multiprocessor, each adding its rows' gradient sums."""
    if device.type != "cuda":
        return 8  # the interpreter: several programs, so that the partial sums are exercised
    return BACKWARD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


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
    """Both kernels once, on a small input."""
    x = torch.arange(120.0, device=device).reshape(3, 40).requires_grad_()
    weight, bias = torch.ones(40, device=device), torch.zeros(40, device=device)
    TritonLayerNorm.apply(x, weight, bias, 1e-5).sum().backward()


def layer_norm(x: torch.Tensor, shape, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """F.layer_norm, through the Triton kernels where BERTRAIN_LAYER_NORM=triton chooses them and they run."""
    if chosen() == "triton" and eligible(x) and builds(x.device):
        return TritonLayerNorm.apply(x, weight, bias, eps)
    return torch.nn.functional.layer_norm(x, shape, weight, bias, eps)

"""Which autocast precision a run uses (`train.mixed_precision`) and TF32. `auto`: bf16 where native (GPUs from
8.0, CPUs with AVX512_BF16/AMX/ARM bf16), fp16 with a scaler on older GPUs, else fp32 (emulated bf16 is slower)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from bertrain.console import first_time

CHOICES = ("auto", "no", "fp16", "bf16")
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (Linux names), aarch64
SLOW_CPU_BF16 = ("measured on a 2-core AVX2 CPU, a bf16 GEMM ran 50-85x slower than fp32 and a tiny BERT "
                 "training step 5-12x slower")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags the kernel reports (x86 `flags`, aarch64 `Features`); empty when unknown."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: a cpuinfo flag, or torch's own dispatch level (AMX)."""
    if cpu_flags() & NATIVE_BF16_CPU_FLAGS:
        return True
    capability = torch.backends.cpu.get_cpu_capability().upper()
    return "AMX" in capability or "BF16" in capability


def local_device_type() -> str:
    """The kind of device this process trains on: cuda, xpu, mps, or cpu when it has no accelerator."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(device)


def choose_mixed_precision(requested: str, device: torch.device | str) -> str:
    """The autocast precision for Accelerate ('no', 'fp16' or 'bf16') for `requested` on `device`."""
    if requested not in CHOICES:
        raise ValueError(f"mixed precision must be one of {', '.join(CHOICES)}, not {requested!r}")
    device = torch.device(device)
    if requested != "auto":
        if requested == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
            if first_time("slow-cpu-bf16"):
                warnings.warn(f"train.mixed_precision is bf16 on a CPU without native bf16 (no AVX512_BF16 / AMX): "
                              f"{SLOW_CPU_BF16}. Use `auto` or `no` for fp32.", UserWarning, stacklevel=2)
        return requested
    if device.type == "cuda":
        return "bf16" if cuda_capability(device) >= (8, 0) else "fp16"
    if device.type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "no"
    return "no"  # MPS, XPU and others: fp32 until measured there


def set_tf32(enabled: bool) -> None:
    """Let fp32 matmuls and convolutions on CUDA use TF32 tensor cores (`train.tf32`); no effect on a CPU."""
    precision = "tf32" if enabled else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9; mixing with allow_tf32 is an error
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled

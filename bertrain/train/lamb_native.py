"""LAMB's CPU kernel (lamb_native.c: fewer memory passes than torch ops, README "Performance"), built per CPU by
the system's C compiler into the user's cache, called via ctypes. No compiler or BERTRAIN_NATIVE_LAMB=0: lamb.py."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bertrain.train.precision import cpu_flags

SOURCE = Path(__file__).with_name("lamb_native.c")
FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-shared", "-fPIC"]
MIN_ELEMENTS_PER_THREAD = 1 << 16  # below this a second thread costs more than it saves

_library: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it is switched off or cannot be built."""
    global _library, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("BERTRAIN_NATIVE_LAMB", "1") != "0":
                _library = _load()
    return _library


def eligible(tensors: list[torch.Tensor]) -> bool:
    """The kernel takes dense, contiguous float32 CPU tensors only."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and t.layout == torch.strided
               for t in tensors)


def lamb_update(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, lr: float,
                beta1: float, beta2: float, eps: float, weight_decay: float, found_inf: torch.Tensor | None,
                grad_scale: torch.Tensor | None = None) -> None:
    """One LAMB update with the kernel (steps already counted); nothing changes where `found_inf` is 1; each
    gradient divided by `grad_scale` (float32 scalar) where given."""
    kernel = library()
    sizes = [p.numel() for p in params]
    threads = max(1, min(torch.get_num_threads(), sum(sizes) // MIN_ELEMENTS_PER_THREAD))
    shares = [_segment_table(share) for share in split_evenly(sizes, threads)]  # alive until the kernels return
    tables = [_address_table(tensors) for tensors in (grads, exp_avgs, exp_avg_sqs, params, steps)]
    grad, exp_avg, exp_avg_sq, param, step = (table.data_ptr() for table in tables)
    inf = None if found_inf is None else found_inf.data_ptr()
    scale = None if grad_scale is None else grad_scale.data_ptr()
    sums = torch.zeros(threads, len(params), 2, dtype=torch.float64)  # per thread: ||w||^2, ||update||^2
    _run_in_threads([(kernel.lamb_moments_and_squares, *_segments(share), grad, exp_avg, exp_avg_sq, param, step,
                      beta1, beta2, eps, weight_decay, inf, scale, sums[i].data_ptr())
                     for i, share in enumerate(shares)])
    total = sums.sum(0)
    _run_in_threads([(kernel.lamb_apply, *_segments(share), exp_avg, exp_avg_sq, param, step,
                      beta1, beta2, eps, weight_decay, lr, inf, total.data_ptr()) for share in shares])


def split_evenly(sizes: list[int], parts: int) -> list[list[tuple[int, int, int]]]:
    """`parts` lists of (tensor, first, end) segments covering every element once, equal in size to within one."""
    total = sum(sizes)
    bounds = [total * k // parts for k in range(parts + 1)]
    shares: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    offset = 0
    for tensor, size in enumerate(sizes):
        for part in range(parts):
            first, end = max(bounds[part], offset), min(bounds[part + 1], offset + size)
            if first < end:
                shares[part].append((tensor, first - offset, end - offset))
        offset += size
    return shares


def _segment_table(share: list[tuple[int, int, int]]) -> torch.Tensor:
    """[3, segments] int64: tensor index, first and end element, one contiguous row each."""
    return torch.tensor(share, dtype=torch.int64).reshape(-1, 3).t().contiguous()


def _segments(table: torch.Tensor) -> tuple:
    return (table.shape[1], *(row.data_ptr() for row in table))


def _address_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


def _run_in_threads(calls: list[tuple]) -> None:
    """Each call on its own thread (the first on this one), then wait for all."""
    global _pool, _pool_size
    if len(calls) - 1 > _pool_size:
        _pool, _pool_size = ThreadPoolExecutor(len(calls) - 1, thread_name_prefix="bertrain-lamb"), len(calls) - 1
    futures = [_pool.submit(function, *args) for function, *args in calls[1:]]
    function, *args = calls[0]
    try:
        function(*args)
    finally:
        for future in futures:
            future.result()


def _load() -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        warnings.warn("LAMB: no C compiler (cc) found, so the CPU step uses torch ops (measured 2.3-2.8x fused "
                      "AdamW's step instead of 1.6x); install gcc to speed it up.", RuntimeWarning, stacklevel=3)
        return None
    for flags in (FLAGS + ["-march=native"], FLAGS):  # -march=native is not known to every compiler
        path = _cache_dir() / f"lamb-{_key(compiler, flags)}.so"
        if path.exists() or _compile(compiler, flags, path):
            try:
                return _declare(ctypes.CDLL(str(path)))
            except OSError:
                continue
    warnings.warn(f"LAMB: {compiler} could not build {SOURCE.name}, so the CPU step uses torch ops (slower).",
                  RuntimeWarning, stacklevel=3)
    return None


def _key(compiler: str, flags: list[str]) -> str:
    # The library is built for this CPU's instructions: a shared cache on a mixed cluster keeps one per CPU.
    cpu = " ".join(sorted(cpu_flags()))
    text = "\n".join([SOURCE.read_text(), compiler, " ".join(flags), platform.machine(), cpu])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertrain" / "kernels"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"bertrain-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _compile(compiler: str, flags: list[str], path: Path) -> bool:
    """Build into a temporary name and rename: processes building at once each get a whole library."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        result = subprocess.run([compiler, *flags, "-o", str(scratch), str(SOURCE), "-lm"],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            return False
        os.replace(scratch, path)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        scratch.unlink(missing_ok=True)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    pointer, integer, real = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    segments = [integer, pointer, pointer, pointer]
    lib.lamb_moments_and_squares.argtypes = segments + [pointer] * 5 + [real] * 4 + [pointer, pointer, pointer]
    lib.lamb_moments_and_squares.restype = None
    lib.lamb_apply.argtypes = segments + [pointer] * 4 + [real] * 5 + [pointer, pointer]
    lib.lamb_apply.restype = None
    return lib

"""Older checkpoints' pickles (optimizer.pt, ...), read only behind `--trust-checkpoint`: each is first scanned
for the globals it would import, then read with weights_only=True; anything else is refused and none of it runs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertrain import rundir
from bertrain.errors import DataError

TRUST_FLAG = "--trust-checkpoint"

try:  # numpy 2 moved the array reconstructor to numpy._core
    from numpy._core.multiarray import _reconstruct as _numpy_reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct as _numpy_reconstruct


def _numpy_rng_globals() -> list:
    """What a pickled `np.random.get_state()` (a uint32 array) needs beyond torch's default allow-list."""
    return [_numpy_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def untrusted_message(checkpoint: Path, files: list[Path]) -> str:
    """Why an older-format checkpoint is refused without the opt-in, and what to do."""
    names = ", ".join(p.relative_to(checkpoint).as_posix() for p in files)
    return (f"Checkpoint {checkpoint} is in the older format: {names} are pickle files, and reading a pickle can "
            f"run any code it carries (anyone who could write this directory could have put some there; the "
            f"checksums do not prevent that). Nothing was loaded. If you wrote this checkpoint, or trust whoever "
            f"did, resume with {TRUST_FLAG}: the files are then read with torch.load(weights_only=True) (tensors "
            f"and plain values only) and the next checkpoint is written in the new format (safetensors + JSON). "
            f"Otherwise start over with --resume restart (moves the old checkpoints aside) or a new --run-dir.")


def check_legacy_files(checkpoint: Path, trust: bool) -> None:
    """Refuse pickles unless `trust`, and then those needing more than tensors and plain values."""
    files = rundir.legacy_pickle_files(checkpoint)
    if not files:
        return
    if not trust:
        raise DataError(untrusted_message(checkpoint, files))
    with torch.serialization.safe_globals(_numpy_rng_globals()):
        for file in files:
            try:
                unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(file)
            except (OSError, RuntimeError, ValueError, pickle.UnpicklingError) as error:
                raise DataError(f"{file} (older checkpoint format) cannot be read: {type(error).__name__}: "
                                f"{error}. Resume from another checkpoint (--resume PATH).") from None
            if unsafe:
                raise DataError(_unsafe_message(file, ", ".join(unsafe)))


def _unsafe_message(file: Path, what: str) -> str:
    return (f"{file} (older checkpoint format) cannot be loaded safely, even with {TRUST_FLAG}: it needs "
            f"{what}, which only a full unpickle (able to run code) would import. It was not loaded and nothing "
            f"in it ran. Resume from another checkpoint (--resume PATH) or start over (--resume restart).")


def load_legacy(file: Path) -> Any:
    """One older-format state file, read with torch.load(weights_only=True)."""
    try:
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        lines = [line for line in str(error).splitlines() if "GLOBAL" in line or "Unsupported" in line]
        raise DataError(_unsafe_message(file, lines[0].strip() if lines else "more than tensors")) from None

"""A GPU kernel of ours tried once per process before a run relies on it (LAMB's Triton kernels)."""

from __future__ import annotations

import warnings
from typing import Callable, Hashable

import torch


def tried_once(results: dict, key: Hashable, device: torch.device, trial: Callable[[], None],
               failure: Callable[[Exception], str], stacklevel: int = 3) -> bool:
    """Whether `trial` ran on `device` without an error, tried once per `key` (`results` remembers). Random draws in
    it are undone: a resumed run restores its generators before its first step, and a draw after that would shift
    every later dropout mask from the run that never stopped. Autograd is on: the first use may come inside an
    evaluation's no_grad or inference_mode. A failure warns once, `failure(error)`, and the caller's fallback runs."""
    if key not in results:
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
                    torch.inference_mode(False), torch.enable_grad():
                trial()
            results[key] = True
        except Exception as error:  # noqa: BLE001 - compiler and launch errors have no common type
            warnings.warn(failure(error), RuntimeWarning, stacklevel=stacklevel)
            results[key] = False
    return results[key]

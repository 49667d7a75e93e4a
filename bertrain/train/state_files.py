"""Training state on disk without pickle: a tree as NAME.safetensors (tensors, arrays) + NAME.json (the rest),
so reading a checkpoint runs no code. Unknown types are refused when saving, never dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from bertrain.errors import DataError

STATE_FORMAT = 1
# Markers of the JSON tree; a plain dict of the state never has a key starting with "__bertrain_".
_TENSOR, _ARRAY = "__bertrain_tensor__", "__bertrain_ndarray__"
_TUPLE, _ITEMS = "__bertrain_tuple__", "__bertrain_items__"


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """JSON-able copy of `value`; tensors and arrays go to `tensors` under a fresh key."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value.detach().to("cpu").contiguous().clone()  # safetensors refuses shared storage
        return {_TENSOR: key}
    if isinstance(value, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value).copy())
        return {_ARRAY: key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(item, tensors, f"{path}[{i}]") for i, item in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(item, tensors, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(key, str) and not key.startswith("__bertrain_") for key in value):
            return {key: _encode(item, tensors, f"{path}.{key}") for key, item in value.items()}
        # Optimizer state is keyed by parameter index (int): keep keys with their types.
        return {_ITEMS: [[_encode(key, tensors, path), _encode(item, tensors, f"{path}[{key!r}]")]
                         for key, item in value.items()]}
    raise TypeError(f"cannot store {type(value).__name__} at {path} without pickle")


def _decode(value: Any, tensors: dict[str, torch.Tensor], source: Path) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors, source) for item in value]
    if not isinstance(value, dict):
        return value
    try:
        if _TENSOR in value:
            return tensors[value[_TENSOR]]
        if _ARRAY in value:
            return tensors[value[_ARRAY]].numpy()
        if _TUPLE in value:
            return tuple(_decode(item, tensors, source) for item in value[_TUPLE])
        if _ITEMS in value:
            return {_decode(key, tensors, source): _decode(item, tensors, source) for key, item in value[_ITEMS]}
    except (KeyError, TypeError, ValueError) as error:
        raise DataError(f"{source}: damaged state file ({type(error).__name__}: {error}).") from None
    return {key: _decode(item, tensors, source) for key, item in value.items()}


def state_paths(directory: Path, name: str) -> tuple[Path, Path]:
    """The two files of state NAME: NAME.json and NAME.safetensors."""
    return directory / f"{name}.json", directory / f"{name}.safetensors"


def save_state(directory: Path, name: str, state: Any) -> None:
    """Write `state` as NAME.json + NAME.safetensors in `directory` (a checkpoint's temporary dir)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, name)
    json_path, tensor_path = state_paths(Path(directory), name)
    save_file(tensors, str(tensor_path))
    json_path.write_text(json.dumps({"format": STATE_FORMAT, "state": tree}))


def load_state(directory: Path, name: str) -> Any:
    """Read state NAME written by `save_state`; executes nothing from the files."""
    json_path, tensor_path = state_paths(Path(directory), name)
    try:
        document = json.loads(json_path.read_text())
        tensors = load_file(str(tensor_path), device="cpu")
    except (OSError, ValueError) as error:
        raise DataError(f"{json_path.parent}: cannot read state '{name}' ({type(error).__name__}: {error}).") from None
    found = document.get("format") if isinstance(document, dict) else None
    if found != STATE_FORMAT:
        raise DataError(f"{json_path}: unknown state format {found!r}.")
    return _decode(document["state"], tensors, json_path)


def has_state(directory: Path, name: str) -> bool:
    """Whether `directory` holds state NAME in this format."""
    return all(path.is_file() for path in state_paths(Path(directory), name))

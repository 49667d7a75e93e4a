"""`--set section.key=value` overrides: the dotted path checked against the config's dataclasses, the value read for
its key; and a config tree read from a YAML file plus overrides."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from bertrain.config.yaml_tree import (build_dataclass, list_item_type, read_yaml, resolve_config_path,
                                       unknown_key_hint)
from bertrain.errors import ConfigError


def _default_data(cls: type, name: str) -> Any:
    """A field's default as plain data (what the raw mapping would hold)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value] if isinstance(
        value, list) else value


def _list_index(entries: list, part: str, path: str, dotted: str) -> int:
    """The entry index `part` names in the list at `path`, or a ConfigError giving the valid range."""
    valid = f"indexes 0 to {len(entries) - 1}" if entries else "it is empty"
    negative = re.fullmatch(r"-\d+", part) is not None
    if negative and entries:
        raise ConfigError(f"--set {dotted}: '{path}' is a list ({valid}); indexes count from 0, not from the end: "
                          f"the last entry is {path}.{len(entries) - 1}.")
    if not part.isdigit() and not negative:
        raise ConfigError(f"--set {dotted}: '{path}' is a list ({valid}): name an entry by its index, "
                          f"e.g. {path}.0.{part}=...")
    if negative or int(part) >= len(entries):
        count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
        raise ConfigError(f"--set {dotted}: '{path}' has {count} ({valid}), so index {part} is out of range. "
                          f"Add entries in the file, or set the whole list: --set '{path}=[...]'.")
    return int(part)


def set_dotted(tree: dict, dotted: str, value: Any, root_cls: type) -> None:
    """Apply one `section.key=value` override to a raw mapping, validating the path against `root_cls`.
    A list entry is named by its index: `prepare.sources.0.group_by` (or `prepare.sources[0].group_by`)."""
    parts = re.sub(r"\[(\w+)\]", r".\1", dotted).split(".")
    tp: Any = root_cls
    node: Any = tree
    for depth, part in enumerate(parts):
        path = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            key, sub = _list_index(node, part, ".".join(parts[:depth]), dotted), list_item_type(tp)
        else:
            names = [f.name for f in dataclasses.fields(tp)]
            if part not in names:
                hint = unknown_key_hint(part, tp, ".".join(parts[:depth]), root_cls)
                raise ConfigError(f"Unknown config key '{path}' (in --set {dotted}=...).{hint}")
            key, sub = part, typing.get_type_hints(tp)[part]
        if depth == len(parts) - 1:
            value = _read_for(value, sub)
            if dataclasses.is_dataclass(sub) and isinstance(value, dict) and isinstance(node[key] if isinstance(
                    node, list) else node.get(key), dict):
                value = {**node[key], **value}  # `--set optim={lr: 3e-4}` sets those keys, not the whole section
            node[key] = value
            return
        if dataclasses.is_dataclass(sub):
            child = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
            kind = "a mapping"
        elif list_item_type(sub) is not None:
            if isinstance(node, dict) and node.get(key) is None:
                node[key] = _default_data(tp, key) or []
            child, kind = node[key], "a list"
        else:
            raise ConfigError(f"--set {dotted}: '{path}' is a value, not a section.")
        if not isinstance(child, dict if kind == "a mapping" else list):
            raise ConfigError(f"--set {dotted}: '{path}' is not {kind} in the config file.")
        tp, node = sub, child


class OverrideText(str):
    """The value of a `--set section.key=value` as typed: set_dotted reads it for its key."""


def parse_override(text: str) -> tuple[str, OverrideText]:
    """Split `a.b=value`; set_dotted reads the value as YAML (so `null`, `3e-4`, `[0.9, 0.98]` work), or as typed
    for a string key."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like section.key=value (e.g. optim.lr=3e-4).")
    key, raw = text.split("=", 1)
    return key.strip(), OverrideText(raw)


def _read_for(value: Any, tp: Any) -> Any:
    """An override's text as its key `tp` wants it: a string key keeps it as typed (YAML read `0123` as 83, `12:30`
    as 750, `no` as False, `a #3` as `a`, a date as a date), null aside; any other key reads it as YAML."""
    if not isinstance(value, OverrideText):
        return value
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    text = value.strip()
    quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"  # a quoted string (JSON's, a shell's)
    if str in args and all(arg in (str, type(None)) for arg in args) and not quoted:
        return None if type(None) in args and text in ("null", "Null", "NULL", "~") else text
    try:
        return yaml.safe_load(value) if text else ""
    except yaml.YAMLError:
        return str(value)


def read_tree(cls: type, path: str | Path | None, overrides: typing.Iterable[str] = (), kind: str = "configs") -> Any:
    """A YAML file (or nothing) plus `section.key=value` overrides built into the dataclass tree `cls`."""
    tree: dict = {}
    if path is not None:
        tree = read_yaml(resolve_config_path(path, kind))
    hints = typing.get_type_hints(cls)
    for name, value in tree.items():  # `model:` with every key commented out is YAML's null: no keys, not an error
        if value is None and dataclasses.is_dataclass(hints.get(name)):
            tree[name] = {}
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(tree, key, value, cls)
    return build_dataclass(cls, tree)

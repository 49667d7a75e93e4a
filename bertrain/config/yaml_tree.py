"""A typed-YAML engine over any dataclass tree: strict reading, coercion, `--set` overrides; errors name the
key, the value and what to do, with the nearest valid key suggested."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from bertrain.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden here, not duplicates
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{loader.name}: duplicate key '{key}' at line {key_node.start_mark.line + 1} "
                f"(first at line {seen[key]}). Remove one of them.")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping with duplicate keys refused; errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"Cannot read config file {path}: {error.strerror}.") from None
    except UnicodeDecodeError as error:  # a Latin-1 comment: say where, as for a YAML error
        line = error.object[:error.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: byte 0x{error.object[error.start]:02x} is not UTF-8. Save the file "
                          "as UTF-8 (or remove the character).") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, model:, ...), not a {type(data).__name__}.")
    return data


def type_name(tp: Any) -> str:
    """How an annotation reads in messages and docs: `int | null`, `'token' | 'ngram'`, `list[float]`."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"list[{type_name(inner)}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


class _Mismatch(Exception):
    """A value that does not fit a scalar type; `_coerce` turns it into a ConfigError naming the key."""


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "false", "no", "off"):
        return value.lower() in ("true", "yes", "on")
    raise _Mismatch


def _to_number(value: Any, integer: bool) -> int | float:
    if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
        try:
            value = float(value.replace("_", ""))
        except ValueError:
            raise _Mismatch from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch
    if not integer:
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise _Mismatch
    return int(value)


def _to_str(value: Any) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise _Mismatch


_SCALARS = {bool: _to_bool, int: lambda value: _to_number(value, integer=True),
            float: lambda value: _to_number(value, integer=False), str: _to_str, Any: lambda value: value}


def _coerce_literal(value: Any, choices: tuple, key: str) -> Any:
    if isinstance(value, bool):  # YAML 1.1 reads `no`/`off` as False: map back to the spelled choice
        spelled = [c for c in (("no", "off", "false") if not value else ("yes", "on", "true")) if c in choices]
        if spelled:
            return spelled[0]
    if value in choices and not isinstance(value, bool):
        return value
    same_letters = [str(c) for c in choices if str(c).lower() == str(value).lower()]  # `NSP`: difflib sees no match
    close = same_letters or difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"Config key '{key}': {value!r} is not one of {', '.join(map(repr, choices))}.{hint}")


def _coerce_union(value: Any, args: tuple, key: str) -> Any:
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, key)
        except ConfigError:
            pass
    raise _Mismatch


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type or raise a ConfigError naming key, value, type."""
    origin = typing.get_origin(tp)
    try:
        if origin in (typing.Union, types.UnionType):
            return _coerce_union(value, typing.get_args(tp), key)
        if origin is Literal:
            return _coerce_literal(value, typing.get_args(tp), key)
        if origin is list:
            (inner,) = typing.get_args(tp)
            if isinstance(value, tuple):
                value = list(value)
            if not isinstance(value, list):
                raise _Mismatch
            return [_coerce(item, inner, f"{key}[{i}]") for i, item in enumerate(value)]
        if dataclasses.is_dataclass(tp):
            if isinstance(value, tp):
                return value
            if not isinstance(value, dict):
                raise ConfigError(f"Config key '{key}' must be a mapping of {tp.__name__} keys, not {value!r}.")
            return _build(tp, value, key)
        if tp in _SCALARS:
            return _SCALARS[tp](value)
        raise _Mismatch
    except _Mismatch:
        hint = " (YAML's none is null or ~)" if str(value).lower() == "none" and "null" in type_name(tp) else ""
        raise ConfigError(f"Config key '{key}': {value!r} is not a valid {type_name(tp)}{hint}.") from None


class _UnknownKey(Exception):
    """An unknown key met while building a nested section; the root call words it with every key in view."""

    def __init__(self, dotted: str, name: str, cls: type, prefix: str) -> None:
        super().__init__(dotted)
        self.dotted, self.name, self.cls, self.prefix = dotted, name, cls, prefix


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _leaf_keys(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every value (non-section) key under `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        item = list_item_type(hints[f.name])
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_keys(hints[f.name], _join(prefix, f.name))
        elif dataclasses.is_dataclass(item):  # a list of sections: its keys as the first entry's
            yield from _leaf_keys(item, _join(prefix, f.name) + ".0")
        else:
            yield _join(prefix, f.name), f


def nearest_key(name: str, cls: type, prefix: str = "", root: type | None = None) -> str | None:
    """The valid dotted key a user most likely meant by `name` inside section `cls` (at `prefix`), or None: an
    alias, the key in another section, a close spelling, the key's initials, a close spelling elsewhere."""
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    for f in fields:
        if name in f.metadata.get("aliases", ()):
            return _join(prefix, f.name)
    elsewhere = list(_leaf_keys(root)) if root is not None else []
    for dotted, f in elsewhere:
        if name == f.name or name in f.metadata.get("aliases", ()):
            return dotted
    # Another case (`LR`), or the start of one key (`mlm_prob`, which difflib took for `mask_prob`), before spelling.
    start = [key for key in names if key == name.lower()] or [key for key in names if key.startswith(name.lower())]
    if len(start) == 1 and len(name) >= 2:
        return _join(prefix, start[0])
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    if close:
        return _join(prefix, close[0])
    initials = "".join(word[0] for word in name.split("_") if word)
    if len(initials) > 1 and initials in names:
        return _join(prefix, initials)
    close = difflib.get_close_matches(name, [f.name for _, f in elsewhere], n=1, cutoff=0.75)
    if close:
        return next(dotted for dotted, f in elsewhere if f.name == close[0])
    return None


def unknown_key_hint(name: str, cls: type, prefix: str, root: type | None) -> str:
    """' Did you mean 'optim.lr'?' with the nearest valid key, else the list of valid keys."""
    suggestion = nearest_key(name, cls, prefix, root)
    if suggestion is not None:
        return f" Did you mean '{suggestion}'?"
    return f" Valid keys here: {', '.join(_join(prefix, f.name) for f in dataclasses.fields(cls))}."


def build_dataclass(cls: type, values: dict) -> Any:
    """Build `cls` from a mapping, refusing unknown keys (with the nearest valid one) and wrong types."""
    try:
        return _build(cls, values, "")
    except _UnknownKey as unknown:  # worded here, where every section is in view for the suggestion
        hint = unknown_key_hint(unknown.name, unknown.cls, unknown.prefix, cls)
        raise ConfigError(f"Unknown config key '{unknown.dotted}'.{hint}") from None


def _build(cls: type, values: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = _join(prefix, str(key))
        if key not in names:
            raise _UnknownKey(dotted, str(key), cls, prefix)
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def flatten(tree: dict | list, prefix: str = "", lists: bool = False) -> dict[str, Any]:
    """A nested mapping as {"section.key": value}; with `lists`, list items too ("prepare.sources.0.path")."""
    flat = {}
    for key, value in (enumerate(tree) if isinstance(tree, list) else tree.items()):
        if isinstance(value, dict) or (lists and isinstance(value, list) and value):
            flat.update(flatten(value, f"{prefix}{key}.", lists))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def list_item_type(tp: Any) -> Any:
    """X for an annotation `list[X]` or `list[X] | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return typing.get_args(tp)[0] if typing.get_origin(tp) is list else None


def shipped_dir(kind: str) -> Path:
    """The directory of the shipped `configs` or `data_recipes` (package data)."""
    return Path(__file__).resolve().parents[1] / kind


def shipped_files(kind: str) -> list[Path]:
    """The shipped `configs` or `data_recipes` YAML files, sorted by name."""
    return sorted(shipped_dir(kind).glob("*.yaml"))


def describe_yaml(path: Path) -> str:
    """A YAML file's one-line description: the first sentence of its opening comment ('' without one)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.removeprefix("#")
        if not line.startswith("#") or not text.strip() or text.startswith("   "):
            break  # the opening comment ends at code, an empty comment line or an indented command
        lines.append(text.strip())
    paragraph = " ".join(lines)
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", paragraph, maxsplit=1)[0].rstrip(":;, ")
    return first if not first or first.endswith((".", "!", "?")) else first + "."


def find_config_path(name: str | Path, kind: str = "configs") -> Path | None:
    """A file as given if it exists, else the shipped file of that name (`albert_base`, `albert_base.yaml`): a
    directory that happens to have a shipped name (a `pydoc/` folder beside `--recipe pydoc`) does not hide it."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = shipped_dir(kind) / (path.name if path.suffix in (".yaml", ".yml") else path.name + ".yaml")
    return shipped if shipped.is_file() else None


def resolve_config_path(name: str | Path, kind: str = "configs") -> Path:
    """find_config_path, or a ConfigError naming the nearest shipped name."""
    found = find_config_path(name, kind)
    if found is not None:
        return found
    available = [p.stem for p in shipped_files(kind)]
    close = difflib.get_close_matches(Path(name).stem, available, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    what = "is a directory, not a YAML file" if Path(name).is_dir() else "does not exist"
    raise ConfigError(
        f"Config file '{name}' {what}, and no shipped {kind} file has that name.{hint} "
        f"Shipped: {', '.join(available) or 'none'}.")


def to_dict(config: Any) -> dict:
    """The config tree as plain data (for YAML dumps and checkpoints)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any) -> str:
    """The resolved config as YAML that loads back to the same tree."""
    return yaml.safe_dump(to_dict(config), sort_keys=False, allow_unicode=True)

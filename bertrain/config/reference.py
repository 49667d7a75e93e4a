"""The config reference (`bertrain config reference`, docs/config.md) and `config show --explain`,
generated from the schema's field helps."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import yaml

from bertrain.config.finetune import EvaluateConfig, TaskFile
from bertrain.config.schema import Config, Recipe, SourceConfig
from bertrain.config.yaml_tree import type_name


def iter_docs(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every documented key under `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from iter_docs(tp, dotted + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        yield dotted, type_name(tp), default, f.metadata.get("help", "")


def config_reference_markdown() -> str:
    """The reference of every config and recipe key, generated from the dataclasses."""
    lines = ["# Configuration reference", "",
             "Generated from `bertrain/config/schema.py` by `bertrain config reference`; do not edit by hand.",
             "Any key can be overridden on the command line: `--set section.key=value`; an entry of a list by its "
             "index from 0: `--set prepare.sources.0.group_by=title`.", ""]
    for title, cls in (("Training config (`bertrain pretrain --config`)", Config),
                       ("Data recipe (`bertrain prepare --recipe`)", Recipe),
                       ("Each entry of `prepare.sources`", SourceConfig),
                       ("Fine-tuning recipe (`bertrain evaluate --set finetune.KEY=VALUE`)", EvaluateConfig),
                       ("A task file (`bertrain evaluate --tasks FILE.yaml`)", TaskFile)):
        lines += [f"## {title}", ""]
        section = None
        for dotted, tp, default, help_text in iter_docs(cls):
            head = dotted.split(".")[0] if "." in dotted else ""
            if head != section:
                section = head
                sub = typing.get_type_hints(cls).get(head) if head else None
                if sub is not None:
                    lines += [f"### `{head}`", "", (sub.__doc__ or "").strip(), ""]
                lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
            shown = "null" if default is None else yaml.safe_dump(default, default_flow_style=True).strip()
            shown = shown.removesuffix("\n...").strip()
            lines.append(f"| `{dotted}` | `{tp.replace(' | ', ' or ')}` | `{shown}` | {help_text.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def explain_lines(config: Any) -> list[tuple[str, Any, str]]:
    """(dotted key, resolved value, help) for `config show --explain`; each entry of a list of sections (the
    recipe's sources) gets its own rows, `prepare.sources.0.path`, ..., as `--set` names them."""
    rows = []

    def walk(obj: Any, prefix: str, first: str | None = None) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            elif isinstance(value, list) and value and all(dataclasses.is_dataclass(item) for item in value):
                for index, item in enumerate(value):  # the help once, on the first entry
                    walk(item, f"{prefix}{f.name}.{index}.", None if index == 0 else f"{prefix}{f.name}.0.")
            else:
                rows.append((f"{prefix}{f.name}", value,
                             f.metadata.get("help", "") if first is None else f"(see {first}{f.name})"))

    walk(config, "")
    return rows

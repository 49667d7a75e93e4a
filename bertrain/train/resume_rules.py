"""What may change between a checkpoint and the run that resumes it. Every key is in exactly one of FREE_KEYS,
BUDGET_KEYS, FORCE_KEYS and NEVER_KEYS (config/resume_keys.py), so a new key is a decision, not a default."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bertrain import rundir
from bertrain.config import Config, build_dataclass, flatten, read_yaml, to_dict
from bertrain.config.resume_keys import BUDGET_KEYS, FORCE_KEYS, FREE_KEYS, NEVER_KEYS
from bertrain.errors import ConfigError
from bertrain.train.checkpoint import TrainState


@dataclass
class Resumption:
    """A checkpoint's TrainState checked against this run, and what changed since it."""

    state: TrainState
    forced: list[str] = field(default_factory=list)  # differences --force let through
    longer_budget: str | None = None                 # e.g. "train.max_steps: 40 → 42" (a free change)


def is_free(key: str) -> bool:
    """Whether `key` may change between a checkpoint and its resumption without --force."""
    return any(key == free or (free.endswith(".") and key.startswith(free)) for free in FREE_KEYS)


def _change(key: str, old: dict, new: dict) -> str:
    return f"{key}: {old.get(key)!r} → {new.get(key)!r}"


def budget_change(old: dict, new: dict) -> tuple[str | None, list[str]]:
    """("longer", lines), ("other", lines) or (None, []) for the budget keys of two flattened configs.

    max_steps counts only while max_tokens is unset (max_tokens overrides it)."""
    old_tokens, new_tokens = old.get("train.max_tokens"), new.get("train.max_tokens")
    if (old_tokens is None) != (new_tokens is None):  # steps ↔ tokens: a different kind of budget
        return "other", [_change(key, old, new) for key in BUDGET_KEYS if old.get(key) != new.get(key)]
    key = "train.max_steps" if old_tokens is None else "train.max_tokens"
    before, after = old.get(key), new.get(key)
    if before == after:
        return None, []
    return ("longer" if after > before else "other"), [_change(key, old, new)]


def resume_differences(saved: Config, saved_state: TrainState, saved_data: dict, config: Config,
                       world_size: int, data: dict) -> tuple[list[str], list[str], str | None]:
    """(never allowed, allowed with --force, a longer budget) between a checkpoint and this run."""
    never, forceable = [], []
    old, new = flatten(to_dict(saved)), flatten(to_dict(config))
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key) or is_free(key) or key in BUDGET_KEYS:
            continue
        if key in FORCE_KEYS:
            forceable.append(_change(key, old, new))
        else:
            unknown = "" if key in NEVER_KEYS else " (not known to be safe to change on resume)"
            never.append(_change(key, old, new) + unknown)
    kind, lines = budget_change(old, new)
    if kind == "other":
        forceable += lines
    for key in ("tokenizer_sha256", "vocab_size", "tokenizer_kind"):
        if saved_data.get(key) != data.get(key):
            never.append(f"tokenizer {key}: {saved_data.get(key)!r} → {data.get(key)!r}")
    if saved_data.get("fingerprint") != data.get("fingerprint"):
        forceable.append(f"data fingerprint: {saved_data.get('fingerprint', '')[:12]} → {data['fingerprint'][:12]} "
                         f"(different prepared data)")
    if saved_state.world_size != world_size:
        forceable.append(f"processes (world size): {saved_state.world_size} → {world_size}")
    return never, forceable, (lines[0] if kind == "longer" else None)


def resumed_state(path: Path, config: Config, data: dict, world_size: int, micro_batch_size: int,
                  force: bool) -> Resumption:
    """The checkpoint's TrainState, checked against this run, with what --force let through and a longer budget.

    After forced differences the micro-batch position is rescaled to this run's global micro-batch."""
    saved_config = build_dataclass(Config, read_yaml(path / rundir.CONFIG))
    state = TrainState(**json.loads((path / rundir.TRAIN_STATE).read_text()))
    saved_data = json.loads((path / rundir.DATA_INFO).read_text())
    never, forceable, longer = resume_differences(saved_config, state, saved_data, config, world_size, data)
    if never or (forceable and not force):
        lines = "\n".join(f"  {line}" for line in never + forceable)
        what = ("These cannot be overridden, not even with --force (the weights or the optimizer state would not "
                "fit them): resume with the run's own settings, or start a new run (another --run-dir; "
                "model.init_from can start it from this checkpoint's weights)." if never else
                "Pass --force to resume anyway (it allows changes of the data, batch layout, optimizer settings, "
                "precision, seed, dropout and a shorter budget), or use a new --run-dir. A longer budget needs "
                "no --force.")
        raise ConfigError(f"Cannot resume from {path}: the run changed since that checkpoint:\n{lines}\n{what}")
    if forceable:
        old_global = state.micro_batch_size * state.world_size
        state.micro_batch = state.micro_batch * old_global // (micro_batch_size * world_size)
        state.world_size, state.micro_batch_size = world_size, micro_batch_size
    return Resumption(state, forceable, longer)

"""The run directory: the name of every file a run writes (here only), and reading its checkpoints. A checkpoint
counts only when COMPLETE exists and every checksum matches; a RUN_DIR of invalid ones is an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from bertrain.errors import DataError, UsageError
from bertrain.files import file_sha256
from bertrain.tokenizer_file import TOKENIZER_FILES

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
REPORT = "report.html"  # `bertrain report`'s page, rewritten after each evaluation
EVALUATION = "results.md"  # a downstream evaluation's table, shown by the report when present
WANDB_ID = "wandb_id.txt"
LOCK = ".lock"
LAUNCHER_LOG = "launcher.log"  # `bertrain launch --run-dir …`: the launcher's own output (torchrun's tracebacks)
TOKENIZER = "tokenizer"
OLD_RUN_PREFIX = "old-"
CHECKPOINTS = "checkpoints"
# What `--resume restart` moves aside (the tokenizer too: old-<time>/ stays a RUN_DIR that export, fill-mask and
# evaluate read); a run has a history once it has checkpoints or metrics.
RUN_HISTORY = (CHECKPOINTS, METRICS, WANDB_ID, CONFIG, TOKENIZER)
# A checkpoint.
PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
DEL_PREFIX = ".del-"  # a checkpoint being removed: renamed first, so a kill never leaves a half step-* behind
MARKER = "COMPLETE"
CHECKSUMS = "checksums.json"
WEIGHTS = "model.safetensors"
TRAIN_STATE = "train_state.json"
DATA_INFO = "data.json"
OPTIMIZER, SCHEDULER, SCALER = "optimizer", "scheduler", "scaler"  # states: NAME.json + NAME.safetensors
# Files of the older checkpoint format that only pickle can read (optimizer.pt, rng-rank00000.pt, ...).
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle")
LEGACY_STATE_SUFFIX = ".pt"  # that format's NAME.pt for a state
DEFAULT_ADVICE = ("Nothing was loaded, changed or deleted. Restore a valid checkpoint (a backup or another copy of "
                  "the run) and pass its directory explicitly (--resume PATH when training), or start over in a new "
                  "run dir.")


def rng_state_name(rank: int) -> str:
    """The state name of a rank's RNG in a checkpoint: rng-rank00000(.json/.safetensors)."""
    return f"rng-rank{rank:05d}"


class NoValidCheckpoint(DataError):
    """A RUN_DIR has checkpoints but none is valid; the message lists each one and why it was rejected."""

    def __init__(self, run_dir: str | Path, rejected: list[tuple[Path, str]], advice: str = DEFAULT_ADVICE):
        self.run_dir, self.rejected = Path(run_dir), list(rejected)
        lines = [f"RUN_DIR {run_dir} has {len(rejected)} checkpoint(s) but none is valid:"]
        super().__init__("\n".join(lines + [f"  {path}: {why}" for path, why in rejected] + [advice]))


def checkpoint_name(step: int) -> str:
    """`step-00001000` for step 1000."""
    return f"{PREFIX}{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints."""
    return Path(run_dir) / CHECKPOINTS


def step_of(path: str | Path) -> int | None:
    """The step number of a `step-XXXXXXXX` directory, else None."""
    name = Path(path).name
    digits = name[len(PREFIX):]
    return int(digits) if name.startswith(PREFIX) and digits.isdigit() else None


def payload_files(path: Path) -> list[str]:
    """Every file under a checkpoint dir but the marker and checksum list, as sorted relative names."""
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                  if p.is_file() and p.name not in (MARKER, CHECKSUMS))


def verify_checkpoint(path: str | Path) -> str | None:
    """None when the checkpoint is complete and intact, else what is wrong with it."""
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    marker, sums = path / MARKER, path / CHECKSUMS
    if not marker.is_file():
        return f"no {MARKER} marker (the save did not finish)"
    if not sums.is_file():
        return f"no {CHECKSUMS}"
    if marker.read_text().strip() != file_sha256(sums):
        return f"{CHECKSUMS} does not match the {MARKER} marker"
    try:
        checksums = json.loads(sums.read_text())
    except json.JSONDecodeError:
        return f"{CHECKSUMS} is not valid JSON"
    if not isinstance(checksums, dict):
        return f"{CHECKSUMS} is not a mapping of file names to digests"
    for name, expected in checksums.items():
        if not (path / name).is_file():
            return f"{name} is missing"
        if file_sha256(path / name) != expected:
            return f"{name} is damaged (checksum mismatch)"
    # A user may drop the run's tokenizer into a checkpoint dir to hand it on; nothing else may be added.
    added = [name for name in payload_files(path) if name not in checksums
             and name not in TOKENIZER_FILES and not name.startswith(TOKENIZER + "/")]
    if added:
        return f"{added[0]} is not listed in {CHECKSUMS} (added after the save)"
    return None


def legacy_pickle_files(checkpoint: str | Path) -> list[Path]:
    """The pickle files of an older-format checkpoint (loading them can run code)."""
    return sorted(p for p in Path(checkpoint).rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)


def iter_checkpoints(run_dir: str | Path) -> Iterator[Path]:
    """step-XXXXXXXX directories of a run, newest first (not verified)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return iter(())
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return iter(p for _, p in sorted(found, reverse=True))


def incomplete_saves(run_dir: str | Path) -> list[Path]:
    """Temporary directories left by saves that never finished."""
    root = checkpoints_dir(run_dir)
    return sorted(root.glob(TMP_PREFIX + "*")) if root.is_dir() else []


def removal_leftovers(run_dir: str | Path, newest: Path | None) -> list[Path]:
    """What interrupted removals left: `.del-*` dirs, and unmarked step-* older than `newest` (the run's newest valid
    checkpoint); a newer unmarked one may be a save that died half-way, so it stays to be reported."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    newest_step = step_of(newest) if newest is not None and newest.parent.resolve() == root.resolve() else None
    older = [p for p in iter_checkpoints(run_dir) if newest_step is not None and step_of(p) < newest_step
             and not (p / MARKER).is_file()]
    return sorted(root.glob(DEL_PREFIX + "*")) + sorted(older)


def find_latest_checkpoint(run_dir: str | Path, skipped: list[tuple[Path, str]] | None = None, *,
                           require_valid: bool = False) -> Path | None:
    """The newest valid checkpoint of RUN_DIR (invalid ones go to `skipped`), or None; with `require_valid`,
    None only for a run with no checkpoint at all, and NoValidCheckpoint when none is valid."""
    rejected = [(p, "incomplete save (interrupted before it finished)") for p in incomplete_saves(run_dir)]
    found = None
    for path in iter_checkpoints(run_dir):
        problem = verify_checkpoint(path)
        if problem is None:
            found = path
            break
        rejected.append((path, problem))
    if skipped is not None:
        skipped.extend(rejected)
    # Interrupted saves alone mean no save ever finished: starting over loses nothing.
    if found is None and require_valid and any(step_of(p) is not None for p, _ in rejected):
        raise NoValidCheckpoint(run_dir, rejected)
    return found


def resolve_checkpoint(path: str | Path, skipped: list[tuple[Path, str]] | None = None) -> Path:
    """The checkpoint PATH means: a RUN_DIR's newest valid one (invalid ones to `skipped`) or a verified dir."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.")
    # A run holds its lock (and logs metrics) from its start, before its first checkpoint.
    if (path / CHECKPOINTS).is_dir() or (path / LOCK).is_file() or (path / METRICS).is_file():
        checkpoint = find_latest_checkpoint(path, skipped, require_valid=True)
        if checkpoint is None:
            raise DataError(f"RUN_DIR {path} has no checkpoint yet: the run has saved none so far (it saves every "
                            "train.save_every steps and at the end). Try again once it has saved one.")
        return checkpoint
    if (path / WEIGHTS).is_file() and (path / CONFIG).is_file():
        problem = verify_checkpoint(path)
        if problem:
            raise DataError(f"Checkpoint {path} is not usable: {problem}. Use an older checkpoint, or the RUN_DIR "
                            "(its newest valid checkpoint is chosen).")
        return path
    raise UsageError(f"{path} is neither a checkpoint dir ({WEIGHTS} + {CONFIG}), a RUN_DIR "
                     f"(with {CHECKPOINTS}/) nor a transformers model dir (config.json).")


def find_tokenizer_dir(checkpoint: Path | None, tokenizer_dir: str | Path | None = None) -> Path | None:
    """tokenizer_dir (a DATA_DIR or RUN_DIR means its tokenizer/), else <checkpoint>, its tokenizer/,
    else RUN_DIR/tokenizer; None when none holds a tokenizer.json."""
    if tokenizer_dir is not None:
        path = Path(tokenizer_dir)
        if path.is_file():
            path = path.parent
        if (path / TOKENIZER / "tokenizer.json").is_file():
            path = path / TOKENIZER
        if not (path / "tokenizer.json").is_file():
            raise DataError(f"Tokenizer dir {path} has no tokenizer.json.")
        return path
    if checkpoint is None:
        return None
    for candidate in (checkpoint, checkpoint / TOKENIZER, checkpoint.parent.parent / TOKENIZER):
        if (candidate / "tokenizer.json").is_file():
            return candidate
    return None

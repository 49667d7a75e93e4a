"""The run directory: its checkpoints (atomic saves, verification, rotation) and its tokenizer.

RUN_DIR/
  tokenizer/             the prepared data's tokenizer (copied by the trainer)
  checkpoints/step-00001000/
    model.safetensors, config.yaml, train_state.json, ...  the trainer's files: whatever it writes
    checksums.json         sha256 of every other file
    COMPLETE               written last: sha256 of checksums.json

A save writes to a temporary directory, fsyncs, checksums, marks complete, then renames. A directory
counts only when COMPLETE exists, every checksum matches and no file was added after the save, so a
crash at any point of a save leaves the previous checkpoint as the newest valid one. A RUN_DIR whose
checkpoints are all invalid is an error (`NoValidCheckpoint`), never a silent fresh start.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from bertrain.errors import DataError, UsageError
from bertrain.files import file_sha256, fsync_path, write_atomic
from bertrain.tokenizer_file import TOKENIZER_FILES

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
MARKER = "COMPLETE"
CHECKSUMS = "checksums.json"
WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
TOKENIZER = "tokenizer"
# Files of the older checkpoint format that only pickle can read (optimizer.pt, rng-rank00000.pt, ...).
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle")
DEFAULT_ADVICE = ("Nothing was loaded, changed or deleted. Restore a valid checkpoint (a backup or another copy of "
                  "the run) and pass its directory explicitly (--resume PATH when training), or start over in a new "
                  "run dir.")


class NoValidCheckpoint(DataError):
    """A RUN_DIR has checkpoints but none is valid; the message lists each one and why it was rejected."""

    def __init__(self, run_dir: str | Path, rejected: list[tuple[Path, str]], advice: str = DEFAULT_ADVICE):
        self.run_dir, self.rejected = Path(run_dir), list(rejected)
        super().__init__(describe_rejected(run_dir, rejected, advice))


def describe_rejected(run_dir: str | Path, rejected: list[tuple[Path, str]], advice: str = DEFAULT_ADVICE) -> str:
    """The NoValidCheckpoint message: a header, one line per rejected checkpoint (path: why), the advice."""
    lines = [f"RUN_DIR {run_dir} has {len(rejected)} checkpoint(s) but none is valid:"]
    lines += [f"  {path}: {why}" for path, why in rejected]
    return "\n".join(lines + [advice])


def checkpoint_name(step: int) -> str:
    """`step-00001000` for step 1000."""
    return f"{PREFIX}{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints."""
    return Path(run_dir) / CHECKPOINTS


def step_of(path: str | Path) -> int | None:
    """The step number of a `step-XXXXXXXX` directory, else None."""
    name = Path(path).name
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX):]
    return int(digits) if digits.isdigit() else None


def write_text_file(path: Path, text: str) -> None:
    """Write text atomically and fsync it."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), fsync=True)


def begin_save(run_dir: str | Path, step: int) -> Path:
    """Create an empty temporary directory for the checkpoint of `step` (rank 0 only)."""
    checkpoints_dir(run_dir).mkdir(parents=True, exist_ok=True)
    for stale in incomplete_saves(run_dir):  # left by a crash during an earlier save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temporary_dir(run_dir, step)
    tmp.mkdir()
    return tmp


def temporary_dir(run_dir: str | Path, step: int) -> Path:
    """The temporary directory `begin_save` made (other ranks write their files into it)."""
    return checkpoints_dir(run_dir) / f"{TMP_PREFIX}{step:08d}"


def finish_save(tmp: Path, keep_last: int | None = None) -> Path:
    """Checksum every file, write COMPLETE last, fsync, rename to step-XXXXXXXX, then rotate."""
    files = _payload_files(tmp)
    checksums = {name: file_sha256(tmp / name) for name in files}
    for name in files:
        fsync_path(tmp / name)
    write_text_file(tmp / CHECKSUMS, json.dumps(checksums, indent=1, sort_keys=True))
    write_text_file(tmp / MARKER, file_sha256(tmp / CHECKSUMS) + "\n")
    fsync_path(tmp)
    final = tmp.parent / tmp.name.replace(TMP_PREFIX, PREFIX, 1)
    if final.exists():  # an older save of the same step (e.g. a run resumed before it): replace it
        remove_checkpoint(final)
    os.replace(tmp, final)
    fsync_path(final.parent)
    if keep_last:
        rotate(final.parent.parent, keep_last)
    return final


def _payload_files(path: Path) -> list[str]:
    """Every file under a checkpoint dir but the marker and checksum list, as sorted relative names."""
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                  if p.is_file() and p.name not in (MARKER, CHECKSUMS))


def _added_after_save(path: Path, listed: dict) -> list[str]:
    """Files present but not in checksums.json (a tokenizer handed on with the checkpoint excepted)."""
    # A user may drop the run's tokenizer into a checkpoint dir to hand it on; nothing else may be added.
    return [name for name in _payload_files(path) if name not in listed
            and name not in TOKENIZER_FILES and not name.startswith(TOKENIZER + "/")]


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
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file_sha256(file) != expected:
            return f"{name} is damaged (checksum mismatch)"
    added = _added_after_save(path, checksums)
    if added:
        return f"{added[0]} is not listed in {CHECKSUMS} (added after the save)"
    return None


def legacy_pickle_files(checkpoint: str | Path) -> list[Path]:
    """The pickle files of an older-format checkpoint (optimizer.pt, scheduler.pt, rng-rank00000.pt ...):
    loading them can run code, so the trainer refuses them unless the user opts in."""
    path = Path(checkpoint)
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)


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


def find_latest_checkpoint(run_dir: str | Path, skipped: list[tuple[Path, str]] | None = None, *,
                           require_valid: bool = False) -> Path | None:
    """The newest valid checkpoint of RUN_DIR; invalid ones met on the way are appended to `skipped`.

    None when there is none; with `require_valid`, None only when the run has no checkpoint at all (a
    fresh run), and NoValidCheckpoint when it has some but none is valid."""
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


def remove_checkpoint(path: Path) -> None:
    """Remove the marker first so a half-deleted directory can never look valid."""
    (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def rotate(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Keep the newest `keep_last` complete checkpoints; remove older ones. Returns the removed."""
    complete = [p for p in iter_checkpoints(run_dir) if (p / MARKER).is_file()]
    removed = complete[keep_last:]
    for path in removed:
        remove_checkpoint(path)
    return removed


def resolve_checkpoint(path: str | Path, skipped: list[tuple[Path, str]] | None = None) -> Path:
    """The checkpoint a user means by PATH: a RUN_DIR's newest valid checkpoint (invalid ones met on
    the way are appended to `skipped`), or a checkpoint dir as given once it verifies."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.")
    if (path / CHECKPOINTS).is_dir():
        checkpoint = find_latest_checkpoint(path, skipped, require_valid=True)
        if checkpoint is None:
            raise DataError(f"{path}/{CHECKPOINTS} holds no complete checkpoint yet (the run saved none).")
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

"""Atomic checkpoints: write to a temporary directory, fsync, checksum, mark complete, rename.

RUN_DIR/checkpoints/step-00001000/
  model.safetensors, optimizer.pt, scheduler.pt, scaler.pt, train_state.json, config.yaml,
  rng-rank00000.pt ...   (one per rank)
  checksums.json         sha256 of every other file
  COMPLETE               written last: sha256 of checksums.json

A directory counts only when COMPLETE exists and every checksum matches, so a crash at any point
of a save leaves the previous checkpoint as the newest valid one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from bertrain.data.format import file_sha256, fsync_path, write_atomic

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
MARKER = "COMPLETE"
CHECKSUMS = "checksums.json"


def checkpoint_name(step: int) -> str:
    """`step-00001000` for step 1000."""
    return f"{PREFIX}{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
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
    files = sorted(p for p in tmp.iterdir() if p.is_file() and p.name not in (MARKER, CHECKSUMS))
    checksums = {p.name: file_sha256(p) for p in files}
    for p in files:
        fsync_path(p)
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
    for name, expected in checksums.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file_sha256(file) != expected:
            return f"{name} is damaged (checksum mismatch)"
    return None


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


def find_latest_checkpoint(run_dir: str | Path, skipped: list[tuple[Path, str]] | None = None) -> Path | None:
    """The newest valid checkpoint of RUN_DIR; invalid ones met on the way are appended to `skipped`."""
    if skipped is not None:
        skipped.extend((p, "incomplete save (interrupted before it finished)") for p in incomplete_saves(run_dir))
    for path in iter_checkpoints(run_dir):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        if skipped is not None:
            skipped.append((path, problem))
    return None


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

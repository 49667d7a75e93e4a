"""DATA_DIR bookkeeping shared by the prepare stages: layout names, the lock, JSON records, stage keys."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from bertrain.config import PrepareConfig, TokenizerConfig
from bertrain.data.format import PREPARE_WORK
from bertrain.errors import UsageError
from bertrain.files import write_atomic

STAGE_VERSION = 2            # bump when a change makes old intermediate outputs invalid (2: any-script sentences)
# Shards' encoding and word starts (format 2): bump when their rules change, so that a prepare resumed across the
# change rebuilds its shards instead of mixing two encodings (2: a literal [MASK] in the text is text; 3: in
# Unigram units punctuation is a word of its own and the piece after it starts one, as in WordPiece's).
WORD_UNITS_VERSION = 3
WORK = PREPARE_WORK  # the intermediate outputs; open_prepared names a DATA_DIR that has it unfinished


def settings_hash(obj: Any) -> str:
    """sha256 of an object's sorted JSON: the key a stage's output is checked against."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Write a JSON record atomically (readers never see half of one)."""
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_json(path: Path) -> Optional[dict]:
    """A JSON record, or None when it is missing or damaged (the stage then runs again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def documents_settings(config: PrepareConfig) -> dict[str, Any]:
    """Prepare settings that change the documents (workers and the word units, made from them later, do not)."""
    settings = dataclasses.asdict(config)
    settings.pop("workers")
    settings.pop("word_segmenter")
    for source in settings["sources"]:
        if not source.get("group_by"):
            # A key only grouped sources have: the settings (and fingerprints) of other sources stay
            # what they were before the key existed.
            source.pop("group_by", None)
    return settings


def tokenizer_settings(config: TokenizerConfig) -> dict[str, Any]:
    """Tokenizer settings that change the trained tokenizer (its output path does not)."""
    settings = dataclasses.asdict(config)
    settings.pop("path")
    return settings


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """An exclusive lock on DATA_DIR (concurrent runs and job-array tasks take turns)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".prepare.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_out_dir(out: Path) -> None:
    """Refuse an --out that is a file, or a directory holding something other than prepared data."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory for the prepared data.")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()} - {".prepare.lock"}
        if entries and not entries & {"manifest.json", WORK}:
            raise UsageError(f"--out {out} exists and is not a bertrain DATA_DIR (it holds "
                             f"{', '.join(sorted(entries)[:5])}). Choose a new or empty directory.")


def clear(out: Path, *names: str) -> None:
    """Remove these files or directories of DATA_DIR, where they exist."""
    for name in names:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

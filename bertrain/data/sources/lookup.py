"""Resolving a configured source (file, directory, glob, datasets directory, hub name) into inputs."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from bertrain.config import SourceConfig
from bertrain.data.sources.pydoc import PYDOC_SOURCE, pydoc_source_identity
from bertrain.errors import ConfigError, DataError

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
FORMATS_BY_SUFFIX = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
                     ".json": "json", ".parquet": "parquet"}
DATASETS_DIR_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
LOCAL_FORMATS = ("text", "jsonl", "json", "parquet", "arrow")  # what a --source of unknown format may be
MAX_NAMED_SKIPS = 200  # skipped files named in the manifest (all are counted)


@dataclass
class InputFile:
    """One file (or datasets directory, or hub dataset) to read, with its resolved format."""

    path: str
    format: str            # text | jsonl | json | parquet | arrow | hub
    compression: Optional[str]
    size: int
    mtime_ns: int

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "compression": self.compression, "bytes": self.size}


def note_skipped(skipped: list, path: str, reason: str) -> None:
    """Name a skipped file in the manifest's list (the first MAX_NAMED_SKIPS; all are counted)."""
    if len(skipped) < MAX_NAMED_SKIPS:
        skipped.append({"path": path, "reason": reason})


def _split_suffix(path: Path) -> tuple[Optional[str], str]:
    """(compression, format suffix) from the file name: data.jsonl.zst -> ("zstd", ".jsonl")."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    return compression, (suffixes[-1] if suffixes else "")


def _is_datasets_dir(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in DATASETS_DIR_MARKERS)


def _dir_stat(path: Path) -> tuple[int, int]:
    size, mtime = 0, 0
    for item in sorted(path.rglob("*")):
        if item.is_file():
            stat = item.stat()
            size, mtime = size + stat.st_size, max(mtime, stat.st_mtime_ns)
    return size, mtime


def _input_for(path: Path, source: SourceConfig) -> Optional[InputFile]:
    """An InputFile for one path, or None when `auto` does not recognize it."""
    if _is_datasets_dir(path):
        if source.format not in ("auto", "arrow"):
            return None
        size, mtime = _dir_stat(path)
        return InputFile(str(path), "arrow", None, size, mtime)
    compression, suffix = _split_suffix(path)
    fmt = source.format if source.format != "auto" else FORMATS_BY_SUFFIX.get(suffix)
    if fmt is None and suffix == "" and compression is None:
        fmt = "text"  # extensionless files (README, LICENSE-like corpora) are plain text
    if fmt is None:
        return None
    stat = path.stat()
    return InputFile(str(path), fmt, compression, stat.st_size, stat.st_mtime_ns)


def _walk(path: Path) -> list[Path]:
    """Files under a directory, and datasets directories as single entries, sorted."""
    matches = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        root_path = Path(root)
        for name in list(dirs):
            if _is_datasets_dir(root_path / name):
                matches.append(root_path / name)
                dirs.remove(name)
        matches.extend(root_path / name for name in sorted(files))
    return sorted(matches)


def _matching_paths(source: SourceConfig) -> list[Path]:
    """The paths a source names: a glob's matches, a directory's files, or the path itself."""
    path = Path(os.path.expanduser(source.path))
    if any(ch in source.path for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(source.path), recursive=True))
        matches = [p for p in matches if p.is_file() or _is_datasets_dir(p)]
        if not matches:
            raise DataError(f"Source glob '{source.path}' matched no files. Check the path and pattern "
                            f"(use ** for subdirectories).")
        return matches
    if path.is_dir() and not _is_datasets_dir(path):
        matches = _walk(path)
        if not matches:
            raise DataError(f"Source directory '{source.path}' is empty.")
        return matches
    if path.exists():
        return [path]
    raise DataError(f"Source '{source.path}' does not exist. Check prepare.sources[].path (or --source).")


def resolve_source(source: SourceConfig, counts: Counter, skipped: list) -> list[InputFile]:
    """Expand a source (file, dir, glob, datasets dir, hub name, pydoc) into sorted InputFiles."""
    if source.format == "hub":
        spec = json.dumps({"name": source.name, "split": source.split, "data_files": source.data_files}, sort_keys=True)
        return [InputFile(source.path, "hub", None, 0, int(hashlib.sha256(spec.encode()).hexdigest()[:12], 16))]
    if source.format == "pydoc":
        if source.path != PYDOC_SOURCE:
            raise ConfigError(f"Source '{source.path}' has format pydoc, whose only path is '{PYDOC_SOURCE}' "
                              f"(CPython's reference manual, built in). Set path: {PYDOC_SOURCE}, or another format.")
        size, identity = pydoc_source_identity()
        return [InputFile(PYDOC_SOURCE, "pydoc", None, size, identity)]
    if not source.path:
        raise DataError("A source has an empty `path`. Set prepare.sources[].path or pass --source PATH.")
    inputs = []
    for match in _matching_paths(source):
        item = _input_for(match, source)
        if item is None:
            counts["files_skipped_unknown_format"] += 1
            note_skipped(skipped, str(match), "unknown_format")
            continue
        inputs.append(item)
    if not inputs:
        raise DataError(f"Source '{source.path}' has no readable files (.txt, .jsonl, .json, .parquet, "
                        f"optionally .gz/.zst, or a datasets save_to_disk directory). Set `format:` to force one.")
    return inputs


def source_format(source: SourceConfig) -> str:
    """The format a source reads: its `format`, else what `auto` makes of its path's extension; `auto`
    when the path does not say (a directory, a glob without an extension)."""
    if source.format != "auto":
        return source.format
    path = Path(os.path.expanduser(source.path))
    if _is_datasets_dir(path):
        return "arrow"
    compression, suffix = _split_suffix(Path(str(path).rstrip("*?")))
    if suffix in FORMATS_BY_SUFFIX:
        return FORMATS_BY_SUFFIX[suffix]
    return "text" if path.is_file() and not suffix and not compression else "auto"


def sources_for_paths(paths: list[str], recipe_sources: list[SourceConfig]) -> list[tuple[dict, Optional[str]]]:
    """`--source PATH`s as source mappings (format `auto`), each with the other settings of the recipe source it
    follows (named, or None): the recipe's first source of the same format (the one `format: auto` gives by
    extension); for a path whose extension does not say (a directory), the first source of local files."""
    entries = []
    for path in paths:
        fmt = source_format(SourceConfig(path=path))
        followed = (fmt,) if fmt != "auto" else LOCAL_FORMATS + ("auto",)
        match = next((source for source in recipe_sources if source_format(source) in followed), None)
        settings = {k: v for k, v in asdict(match).items() if k != "format"} if match is not None else {}
        entries.append(({**settings, "path": path}, match.path if match is not None else None))
    return entries

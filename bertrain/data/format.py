"""The prepared-corpus format, the contract between `bertrain prepare` and training:

DATA_DIR/
  manifest.json                      fingerprint (sha256 of the rest), format_version 1, tokenizer {kind, word_marker,
                                     vocab_size, sha256, special token ids and strings}, token_dtype, per-split shard
                                     and total counts, each shard's sha256 (of its files in shard_paths' order,
                                     checked by `inspect --verify`; absent in data prepared before Nov 2026);
                                     sources, counts, settings: free-form records
  tokenizer/                         tokenizer.json + tokenizer_config.json + special_tokens_map.json
  {split}/shard-NNNNN.tokens.npy     1-D uint16 (vocab <= 65536) or uint32: all sentences' tokens, concatenated
  {split}/shard-NNNNN.sentences.npy  1-D int64, n_sentences + 1 token offsets: sentence i = tokens[s[i]:s[i+1]]
  {split}/shard-NNNNN.word_starts.npy  1-D uint8, np.packbits of one bit per token: does it start a word (the
                                     unit of whole-word and n-gram masking; see bertrain.data.word_units)
  {split}/shard-NNNNN.documents.npy  1-D int64, n_documents + 1 sentence offsets: doc j = sentences d[j]..d[j+1]

Opened with np.load(mmap_mode="r"); a shard is complete only when its files exist (written under temporary
names, then renamed). Format version 1 (no word_starts files) is still read: its word starts come from the
tokenizer's marks, as they did when it was written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bertrain.errors import DataError
from bertrain.files import write_atomic

PREPARE_WORK = "work"  # DATA_DIR's intermediate outputs: with no manifest.json beside it, an unfinished prepare

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
SPLITS = ("train", "validation")


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def shard_paths(split_dir: Path, name: str, version: int = FORMAT_VERSION) -> dict[str, Path]:
    """The array files of a shard, in the order they are written (documents last)."""
    parts = ("tokens", "sentences") + (("word_starts",) if version >= 2 else ()) + ("documents",)
    return {part: split_dir / f"{name}.{part}.npy" for part in parts}


def shard_sha256(split_dir: Path, name: str, version: int = FORMAT_VERSION,
                 on_bytes: Callable[[int], None] | None = None) -> str:
    """sha256 over a shard's files in shard_paths' order, as its manifest record keeps it; `on_bytes` gets each
    block's size (a progress bar)."""
    digest = hashlib.sha256()
    for path in shard_paths(split_dir, name, version).values():
        with open(path, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
                if on_bytes is not None:
                    on_bytes(len(block))
    return digest.hexdigest()


def _atomic_save(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file, not a name: np.save would append ".npy" to the name
            np.save(handle, array)
    write_atomic(path, write, fsync=True)


def write_shard(split_dir: str | Path, name: str, tokens: np.ndarray, sentence_offsets: np.ndarray,
                document_offsets: np.ndarray, word_starts: np.ndarray) -> dict[str, Any]:
    """Write one shard atomically (documents file last: its presence marks completion); `word_starts` is one
    bool per token."""
    split_dir = Path(split_dir)
    split_dir.mkdir(parents=True, exist_ok=True)
    sentence_offsets = np.asarray(sentence_offsets, dtype=np.int64)
    document_offsets = np.asarray(document_offsets, dtype=np.int64)
    if sentence_offsets[0] != 0 or sentence_offsets[-1] != len(tokens):
        raise ValueError("sentence offsets must start at 0 and end at len(tokens)")
    if document_offsets[0] != 0 or document_offsets[-1] != len(sentence_offsets) - 1:
        raise ValueError("document offsets must start at 0 and end at the number of sentences")
    if len(word_starts) != len(tokens):
        raise ValueError("word starts must have one entry per token")
    paths = shard_paths(split_dir, name)
    _atomic_save(paths["tokens"], np.asarray(tokens))
    _atomic_save(paths["sentences"], sentence_offsets)
    _atomic_save(paths["word_starts"], np.packbits(np.asarray(word_starts, dtype=bool)))
    _atomic_save(paths["documents"], document_offsets)
    return {"name": name, "documents": len(document_offsets) - 1, "sentences": len(sentence_offsets) - 1,
            "tokens": int(len(tokens)), "sha256": shard_sha256(split_dir, name)}


def fingerprint(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's content without its own fingerprint."""
    content = {k: v for k, v in manifest.items() if k != "fingerprint"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def write_manifest(data_dir: str | Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Add format version and fingerprint and write manifest.json atomically."""
    manifest = dict(manifest, format_version=FORMAT_VERSION)
    manifest["fingerprint"] = fingerprint(manifest)
    text = json.dumps(manifest, indent=2, ensure_ascii=False)
    write_atomic(Path(data_dir) / "manifest.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return manifest


@dataclass
class Shard:
    """One memory-mapped shard."""

    name: str
    tokens: np.ndarray             # [n_tokens] uint16/uint32
    sentence_offsets: np.ndarray   # [n_sentences + 1] int64 into tokens
    document_offsets: np.ndarray   # [n_documents + 1] int64 into sentences
    word_starts: np.ndarray | None = None   # [ceil(n_tokens / 8)] uint8 packed bits; None in format version 1


@dataclass
class Split:
    """All shards of one split."""

    name: str
    shards: list[Shard]

    @property
    def num_documents(self) -> int:
        return sum(len(s.document_offsets) - 1 for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.shards)


@dataclass
class PreparedData:
    """A prepared DATA_DIR opened for reading."""

    path: Path
    manifest: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def tokenizer_kind(self) -> str:
        return self.manifest["tokenizer"]["kind"]

    @property
    def special_tokens(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.manifest["tokenizer"]["special_tokens"].items()}

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"

    @property
    def has_word_starts(self) -> bool:
        """Whether the shards store word starts (format version 2 on), else they come from the tokenizer."""
        return int(self.manifest["format_version"]) >= 2

    def split(self, name: str) -> Split:
        """Memory-map every shard of a split listed in the manifest."""
        entry = self.manifest["splits"].get(name)
        if entry is None:
            raise DataError(f"{self.path}: the manifest has no '{name}' split. Run `bertrain prepare` again.")
        shards = []
        for record in entry["shards"]:
            paths = shard_paths(self.path / name, record["name"], int(self.manifest["format_version"]))
            try:
                arrays = {part: np.load(p, mmap_mode="r") for part, p in paths.items()}
            except (OSError, ValueError) as error:
                raise DataError(
                    f"{self.path}: shard {name}/{record['name']} is missing or damaged ({error}). "
                    f"Run `bertrain prepare` again with the same --out to rebuild it.") from None
            shards.append(Shard(record["name"], arrays["tokens"], arrays["sentences"], arrays["documents"],
                                arrays.get("word_starts")))
        return Split(name, shards)


def open_prepared(data_dir: str | Path) -> PreparedData:
    """Open a DATA_DIR, checking that it is a complete prepared corpus."""
    path = Path(data_dir)
    if not str(data_dir):
        raise DataError("No prepared data given: set data.path in the config or pass --data DATA_DIR.")
    if path.is_file():  # raw text given where prepared data belongs: prepare it, never write over it
        raise DataError(f"'{path}' is a file, not a prepared DATA_DIR. Prepare it first: `bertrain prepare --source "
                        f"{path} --out DATA_DIR`, then pass --data DATA_DIR.")
    if not path.is_dir():
        raise DataError(f"Prepared data directory '{path}' does not exist. Create it with "
                        f"`bertrain prepare --recipe RECIPE --out {path}`.")
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        if (path / PREPARE_WORK).is_dir():
            raise DataError(f"'{path}' is a `bertrain prepare` that did not finish (no manifest.json yet). Run the "
                            f"same prepare command again (its --recipe/--source and --out {path}); it resumes.")
        raise DataError(f"'{path}' is not a prepared DATA_DIR (no manifest.json). Prepare your text first: "
                        f"`bertrain prepare --source {path} --out DATA_DIR`, then pass --data DATA_DIR.")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"{manifest_path} cannot be read ({error}). Run `bertrain prepare` again.") from None
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise DataError(f"{manifest_path} has format version {manifest.get('format_version')}, this bertrain "
                        f"reads versions {', '.join(map(str, READABLE_VERSIONS))}. Prepare the data again with "
                        f"this version.")
    if manifest.get("fingerprint") != fingerprint(manifest):
        raise DataError(f"{manifest_path} was modified after it was written (fingerprint mismatch). "
                        f"Prepare the data again.")
    return PreparedData(path, manifest)

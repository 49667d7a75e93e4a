"""Reading sources into raw documents, and normalizing documents into sentences.

Everything streams: files are read in blocks, records one at a time, and nothing holds a whole
corpus in memory. Every document, line or file that is not used is counted in `counts` (a
collections.Counter) so the closing table and the manifest add up.

A raw document is a tuple `(kind, payload, origin)`: kind "sentences" (payload: list of lines,
BERT's one-sentence-per-line format) or "text" (payload: one string of paragraphs separated by
blank lines, split into sentences later).
"""

from __future__ import annotations

import bz2
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
from collections import Counter
from itertools import chain
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.sentences import split_sentences
from bertrain.errors import DataError

BLOCK_BYTES = 1 << 22
BINARY_SNIFF_BYTES = 8000  # like git: a NUL byte in the first 8000 bytes marks a binary file
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
FORMATS_BY_SUFFIX = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
                     ".json": "json", ".parquet": "parquet"}
DATASETS_DIR_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
MAX_NAMED_SKIPS = 200  # skipped files named in the manifest (all are counted)

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200d\u2060\ufeff\ufffe]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_TERMINAL = tuple(".!?…\"'”’)]")


class BinaryFile(Exception):
    """Internal: the file holds NUL bytes and is skipped."""


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


# ----------------------------------------------------------------------------------------------
# Resolving sources to files
# ----------------------------------------------------------------------------------------------


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


def resolve_source(source: SourceConfig, counts: Counter, skipped: list) -> list[InputFile]:
    """Expand a source (file, directory, glob, datasets dir or hub name) into InputFiles, sorted."""
    if source.format == "hub":
        spec = json.dumps({"name": source.name, "split": source.split, "data_files": source.data_files}, sort_keys=True)
        return [InputFile(source.path, "hub", None, 0, int(hashlib.sha256(spec.encode()).hexdigest()[:12], 16))]
    if not source.path:
        raise DataError("A source has an empty `path`. Set prepare.sources[].path or pass --source PATH.")
    path = Path(os.path.expanduser(source.path))
    if any(ch in source.path for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(source.path), recursive=True))
        matches = [p for p in matches if p.is_file() or _is_datasets_dir(p)]
        if not matches:
            raise DataError(f"Source glob '{source.path}' matched no files. Check the path and pattern "
                            f"(use ** for subdirectories).")
    elif path.is_dir() and not _is_datasets_dir(path):
        matches = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            root_path = Path(root)
            for name in list(dirs):
                if _is_datasets_dir(root_path / name):
                    matches.append(root_path / name)
                    dirs.remove(name)
            matches.extend(root_path / name for name in sorted(files))
        matches.sort()
        if not matches:
            raise DataError(f"Source directory '{source.path}' is empty.")
    elif path.exists():
        matches = [path]
    else:
        raise DataError(f"Source '{source.path}' does not exist. Check prepare.sources[].path (or --source).")
    inputs = []
    for match in matches:
        item = _input_for(match, source)
        if item is None:
            counts["files_skipped_unknown_format"] += 1
            if len(skipped) < MAX_NAMED_SKIPS:
                skipped.append({"path": str(match), "reason": "unknown_format"})
            continue
        inputs.append(item)
    if not inputs:
        raise DataError(f"Source '{source.path}' has no readable files (.txt, .jsonl, .json, .parquet, "
                        f"optionally .gz/.zst, or a datasets save_to_disk directory). Set `format:` to force one.")
    return inputs


# ----------------------------------------------------------------------------------------------
# Reading bytes into lines
# ----------------------------------------------------------------------------------------------


class _Progress:
    """Tracks how many on-disk (compressed) bytes of the current file were consumed."""

    def __init__(self, raw: Any):
        self.raw = raw

    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0


def open_binary(item: InputFile) -> tuple[io.BufferedIOBase, Any]:
    """Open a (possibly compressed) file for binary reading: (stream, raw file for progress)."""
    try:
        raw = open(item.path, "rb")
    except OSError as error:
        raise DataError(f"Cannot open {item.path}: {error.strerror}.") from None
    if item.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if item.compression == "bz2":
        return bz2.BZ2File(raw, mode="rb"), raw
    if item.compression == "xz":
        return lzma.LZMAFile(raw, mode="rb"), raw
    if item.compression == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 20), raw
    return raw, raw


def _utf8_cut(block: bytes) -> int:
    """Index where `block` can be cut without splitting a UTF-8 character."""
    end = len(block)
    start = end
    while start > 0 and end - start < 4 and (block[start - 1] & 0xC0) == 0x80:
        start -= 1
    if start == 0:
        return end
    lead = block[start - 1]
    if lead < 0x80:
        return end
    length = 2 if lead >= 0xC0 and lead < 0xE0 else 3 if lead < 0xF0 else 4
    return end if (start - 1) + length <= end else start - 1


def iter_lines(stream: Any, path: str, limit: Optional[int], on_decode_error: str,
               counts: Counter) -> Iterator[tuple[int, str]]:
    """Yield (line number, text) of each line; lines longer than `limit` come in pieces (counted).

    Raises BinaryFile before yielding anything when the first bytes hold a NUL byte.
    """
    line_no, offset, carry = 1, 0, b""
    continued = False  # the first line of this block continues a line cut at the previous block
    first = True
    while True:
        block = carry + stream.read(BLOCK_BYTES)
        carry = b""
        if first:
            if b"\x00" in block[:BINARY_SNIFF_BYTES]:
                raise BinaryFile()
            first = False
        if not block:
            return
        cut = False
        if not block.endswith(b"\n"):
            tail = stream.readline(limit) if limit else stream.readline()
            block += tail
            if limit and tail and not tail.endswith(b"\n") and len(tail) == limit:
                cut = True
                keep = _utf8_cut(block)
                block, carry = block[:keep], block[keep:]
        try:
            text = block.decode("utf-8")
            lines = text.split("\n")
        except UnicodeDecodeError:
            lines = _decode_lines(block, path, line_no, offset, on_decode_error, counts)
        if lines and lines[-1] == "" and block.endswith(b"\n"):
            lines.pop()
        number = line_no
        for index, line in enumerate(lines):
            if line is None:  # an undecodable line skipped (counted)
                number += 1
                continue
            if line.endswith("\r"):
                line = line[:-1]
            last = index == len(lines) - 1
            if limit and len(line) > limit:
                if not (continued and index == 0):
                    counts["lines_split_long"] += 1
                for start in range(0, len(line), limit):
                    yield number, line[start:start + limit]
            else:
                if cut and last and not (continued and index == 0):
                    counts["lines_split_long"] += 1
                yield number, line
            if not (cut and last):
                number += 1
        line_no += block.count(b"\n")
        offset += len(block)
        continued = cut


def _decode_lines(block: bytes, path: str, line_no: int, offset: int, on_decode_error: str,
                  counts: Counter) -> list[Optional[str]]:
    """Decode line by line; an invalid line raises, is replaced or is skipped (None) and counted."""
    out: list[Optional[str]] = []
    position = offset
    for index, raw in enumerate(block.split(b"\n")):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            if on_decode_error == "error":
                raise DataError(
                    f"{path}: invalid UTF-8 at line {line_no + index}, byte offset {position + error.start} "
                    f"(byte 0x{raw[error.start]:02x}; offsets count decompressed bytes). Fix the file, or set "
                    f"prepare.on_decode_error to 'replace' or 'skip' (e.g. --set prepare.on_decode_error=replace)."
                ) from None
            if on_decode_error == "replace":
                counts["lines_decode_replaced"] += 1
                out.append(raw.decode("utf-8", "replace"))
            else:
                counts["lines_decode_skipped"] += 1
                out.append(None)
        position += len(raw) + 1
    return out


# ----------------------------------------------------------------------------------------------
# Files into raw documents
# ----------------------------------------------------------------------------------------------


def guess_text_layout(lines: list[str]) -> str:
    """`sentence_per_line` when nearly every line is one complete sentence, else `paragraphs`."""
    nonblank = [line for line in lines if line.strip()]
    if not nonblank:
        return "paragraphs"
    ends = sum(line.rstrip().endswith(_TERMINAL) for line in nonblank) / len(nonblank)
    multi = sum(len(split_sentences(line)) > 1 for line in nonblank) / len(nonblank)
    return "sentence_per_line" if ends >= 0.8 and multi <= 0.2 else "paragraphs"


def _text_documents(item: InputFile, lines: Iterator[tuple[int, str]], source: SourceConfig,
                    config: PrepareConfig, counts: Counter) -> Iterator[tuple]:
    layout = source.text_layout
    if layout == "auto":
        head = []
        for pair in lines:
            head.append(pair)
            if len(head) >= 400:
                break
        layout = guess_text_layout([line for _, line in head])

        lines = chain(head, lines)
    if layout == "sentence_per_line":
        document, start = [], 0
        for number, line in lines:
            if line.strip():
                if not document:
                    start = number
                document.append(line)
            elif document:
                yield "sentences", document, f"{item.path}:{start}"
                document = []
        if document:
            yield "sentences", document, f"{item.path}:{start}"
        return
    # paragraphs: the file is one document; very long files are cut at a paragraph boundary
    document, size, start = [], 0, 1
    for number, line in lines:
        if size >= config.max_document_chars and not line.strip():
            counts["documents_cut_long"] += 1
            yield "text", "\n".join(document), f"{item.path}:{start}"
            document, size, start = [], 0, number + 1
            continue
        document.append(line)
        size += len(line) + 1
    if document or start == 1:
        yield "text", "\n".join(document), f"{item.path}:{start}"


def _field(record: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(record, dict) or part not in record:
            return None
        record = record[part]
    return record


def _bad_record(message: str, config: PrepareConfig, counts: Counter) -> None:
    if config.on_bad_record == "error":
        raise DataError(f"{message} Fix the data, set the source's text_field, or skip such records with "
                        f"--set prepare.on_bad_record=skip.")
    counts["documents_bad_record"] += 1


def _json_documents(item: InputFile, lines: Iterator[tuple[int, str]], source: SourceConfig,
                    config: PrepareConfig, counts: Counter) -> Iterator[tuple]:
    for number, line in lines:
        if not line.strip():
            continue
        counts["documents_read"] += 1
        where = f"{item.path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            _bad_record(f"{where}: not valid JSON ({error.msg} at column {error.colno}).", config, counts)
            continue
        text = _field(record, source.text_field)
        if not isinstance(text, str):
            problem = "has no" if text is None else f"has a non-string ({type(text).__name__})"
            _bad_record(f"{where}: record {problem} '{source.text_field}' field.", config, counts)
            continue
        yield "text", text, where


def _json_array_documents(item: InputFile, stream: Any, source: SourceConfig, config: PrepareConfig,
                          counts: Counter) -> Iterator[tuple]:
    raw = stream.read()
    try:
        records = json.loads(raw.decode("utf-8", "replace" if config.on_decode_error != "error" else "strict"))
    except UnicodeDecodeError as error:
        raise DataError(f"{item.path}: invalid UTF-8 at byte offset {error.start}. Set "
                        f"prepare.on_decode_error: replace to replace it.") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{item.path}: not valid JSON ({error.msg} at line {error.lineno}).") from None
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list):
        raise DataError(f"{item.path}: expected a JSON array of records or JSON lines.")
    for index, record in enumerate(records):
        counts["documents_read"] += 1
        text = _field(record, source.text_field)
        if not isinstance(text, str):
            _bad_record(f"{item.path}: record {index} has no string '{source.text_field}' field.", config, counts)
            continue
        yield "text", text, f"{item.path}#{index}"


def _column_documents(item: InputFile, batches: Iterator[list], source: SourceConfig, config: PrepareConfig,
                      counts: Counter) -> Iterator[tuple]:
    row = 0
    for values in batches:
        for value in values:
            counts["documents_read"] += 1
            if not isinstance(value, str):
                _bad_record(f"{item.path}: row {row} has a {type(value).__name__} in '{source.text_field}', "
                            f"not a string.", config, counts)
            else:
                yield "text", value, f"{item.path}#{row}"
            row += 1


def _parquet_batches(item: InputFile, source: SourceConfig) -> Iterator[list]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(item.path)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise DataError(f"{item.path}: not a readable Parquet file ({error}).") from None
    names = parquet.schema_arrow.names
    if source.text_field not in names:
        raise DataError(f"{item.path}: no column '{source.text_field}' (columns: {', '.join(names)}). "
                        f"Set the source's text_field.")
    for batch in parquet.iter_batches(batch_size=1024, columns=[source.text_field]):
        yield batch.column(0).to_pylist()


def _arrow_batches(item: InputFile, source: SourceConfig) -> Iterator[list]:
    import datasets

    try:
        dataset = datasets.load_from_disk(item.path)
    except Exception as error:
        raise DataError(f"{item.path}: not a readable datasets directory ({error}).") from None
    if isinstance(dataset, datasets.DatasetDict):
        if source.split not in dataset:
            raise DataError(f"{item.path}: no split '{source.split}' (splits: {', '.join(dataset)}). "
                            f"Set the source's split.")
        dataset = dataset[source.split]
    if source.text_field not in dataset.column_names:
        raise DataError(f"{item.path}: no column '{source.text_field}' (columns: "
                        f"{', '.join(dataset.column_names)}). Set the source's text_field.")
    dataset = dataset.select_columns([source.text_field])
    for batch in dataset.iter(batch_size=1024):
        yield batch[source.text_field]


PACKAGED_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "webdataset", "imagefolder")


def _hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _hub_batches(item: InputFile, source: SourceConfig) -> Iterator[list]:
    # Short timeouts so a machine without network fails in seconds instead of hanging.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    offline = any(os.environ.get(name, "") not in ("", "0") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    local = source.path in PACKAGED_BUILDERS or Path(source.path).exists()
    if not offline and not local and not _hub_reachable():
        # datasets would retry for ~30 s before failing; say it at once.
        raise DataError(f"Cannot load dataset '{source.path}': the Hugging Face hub is not reachable (no "
                        f"network?). Download it on a machine with network and use `datasets.save_to_disk` "
                        f"(format: arrow), or point `data_files` at local files.")
    import datasets

    try:
        dataset = datasets.load_dataset(source.path, source.name, split=source.split, streaming=True,
                                        data_files=source.data_files)
        iterator = iter(dataset)
        first = next(iterator, None)
    except Exception as error:
        hint = ("HF_HUB_OFFLINE is set, so only locally cached datasets load." if offline else
                "Without network access, download it elsewhere and use `datasets.save_to_disk` "
                "(format: arrow), or point `data_files` at local files.")
        raise DataError(f"Cannot load dataset '{source.path}' (split '{source.split}') with "
                        f"datasets.load_dataset: {type(error).__name__}: {str(error)[:300]}. {hint}") from None
    if first is None:
        return
    batch = []
    for record in chain((first,), iterator):
        batch.append(_field(record, source.text_field))
        if len(batch) == 1024:
            yield batch
            batch = []
    if batch:
        yield batch


def read_documents(item: InputFile, source: SourceConfig, config: PrepareConfig, counts: Counter,
                   skipped: list, progress: Optional[list] = None) -> Iterator[tuple]:
    """Raw documents of one input; updates counts (files, documents read, bad records, lines)."""
    if progress is not None:
        progress[:] = [None]
    if item.format in ("parquet", "arrow", "hub"):
        batches = {"parquet": _parquet_batches, "arrow": _arrow_batches, "hub": _hub_batches}[item.format](item, source)
        counts["files_read"] += 1
        yield from _column_documents(item, batches, source, config, counts)
        return
    stream, raw = open_binary(item)
    if progress is not None:
        progress[:] = [_Progress(raw)]
    with stream, raw:
        try:
            if item.format == "json" and _starts_with_bracket(stream):
                counts["files_read"] += 1
                yield from _json_array_documents(item, stream, source, config, counts)
                return
            limit = None if item.format in ("json", "jsonl") else config.max_line_chars
            lines = iter_lines(stream, item.path, limit, config.on_decode_error, counts)
            first = next(lines, None)
        except BinaryFile:
            counts["files_skipped_binary"] += 1
            if len(skipped) < MAX_NAMED_SKIPS:
                skipped.append({"path": item.path, "reason": "binary"})
            return
        except (OSError, EOFError) as error:
            raise DataError(f"Cannot read {item.path}: {error}. Is the file damaged or truncated?") from None
        if first is None:
            counts["files_empty"] += 1
            return
        counts["files_read"] += 1
        lines = chain((first,), lines)
        try:
            if item.format in ("json", "jsonl"):
                yield from _json_documents(item, lines, source, config, counts)
            else:
                for document in _text_documents(item, lines, source, config, counts):
                    counts["documents_read"] += 1
                    yield document
        except (OSError, EOFError) as error:
            raise DataError(f"Cannot read {item.path}: {error}. Is the file damaged or truncated?") from None


def _starts_with_bracket(stream: Any) -> bool:
    if not hasattr(stream, "peek"):
        return False
    head = stream.peek(64).lstrip()
    return head[:1] == b"["


# ----------------------------------------------------------------------------------------------
# Normalizing documents (runs in worker processes)
# ----------------------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Remove control and invisible format characters (keeping tab and newline)."""
    return _CONTROL.sub("", text)


def normalize_document(kind: str, payload: Any, min_sentence_chars: int, max_line_chars: int,
                       counts: Counter) -> list[str]:
    """Clean a raw document and split it into sentences (each a single line of text)."""
    if kind == "sentences":
        sentences = [" ".join(clean_text(line).split()) for line in payload]
    else:
        text = clean_text(payload.replace("\r\n", "\n").replace("\r", "\n"))
        sentences = []
        for paragraph in _PARAGRAPH_BREAK.split(text):
            sentences.extend(split_sentences(paragraph))
    out = []
    for sentence in sentences:
        if len(sentence) < max(1, min_sentence_chars):
            if sentence:
                counts["sentences_short_dropped"] += 1
            continue
        if len(sentence) > max_line_chars:
            counts["sentences_split_long"] += 1
            out.extend(sentence[i:i + max_line_chars] for i in range(0, len(sentence), max_line_chars))
        else:
            out.append(sentence)
    return out


def document_hash(sentences: list[str]) -> bytes:
    """16-byte content hash of a normalized document (dedup and the train/validation split)."""
    return hashlib.blake2b("\n".join(sentences).encode("utf-8"), digest_size=16).digest()


def normalize_batch(batch: list[tuple], min_sentence_chars: int, max_line_chars: int) -> tuple[list, Counter]:
    """Normalize raw documents: [(sentences, hash)] plus the counts of what was dropped."""
    counts: Counter = Counter()
    out = []
    for kind, payload, _origin in batch:
        sentences = normalize_document(kind, payload, min_sentence_chars, max_line_chars, counts)
        out.append((sentences, document_hash(sentences) if sentences else b""))
    return out, counts


# ----------------------------------------------------------------------------------------------
# The demo corpus
# ----------------------------------------------------------------------------------------------


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of a pydoc topic that are prose: grammar rules and code are indented, headings
    are underlined with ***/===."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if line.strip()]
        if lines and not lines[0].startswith(" ") and not set(lines[-1].strip()) <= set("*=-~"):
            paragraphs.append("\n".join(lines))
    return paragraphs


def pydoc_paragraphs() -> list[str]:
    """Prose paragraphs of CPython's pydoc_data.topics (the reference manual), in a fixed order."""
    from pydoc_data.topics import topics

    return [paragraph for key in sorted(topics) for paragraph in prose_paragraphs(topics[key])]


def write_pydoc_corpus(out_dir: str | Path, size_mb: Optional[float] = None, seed: int = 0,
                       paragraphs_per_document: tuple[int, int] = (4, 24)) -> Path:
    """Write pydoc_data.topics prose (code and headings left out) as text files usable as a source.

    Without `size_mb` each topic becomes a .txt file (one document, paragraphs); with it, documents built from shuffled
    paragraphs are written as JSON lines (`{"text": ...}`, files of <= 50 MB) until the corpus
    reaches that size (every document differs, so dedup keeps them).
    """
    import random

    from pydoc_data.topics import topics

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if size_mb is None:
        for key in sorted(topics):
            name = re.sub(r"[^A-Za-z0-9_-]+", "_", key)
            text = "\n\n".join(prose_paragraphs(topics[key]))
            if text:
                (out / f"topic-{name}.txt").write_text(text + "\n", encoding="utf-8")
        return out
    rng = random.Random(seed)
    paragraphs = pydoc_paragraphs()
    target, written, file_index = int(size_mb * 1e6), 0, 0
    while written < target:
        with open(out / f"pydoc-{file_index:04d}.jsonl", "w", encoding="utf-8") as handle:
            in_file = 0
            while written < target and in_file < 50_000_000:
                count = rng.randint(*paragraphs_per_document)
                text = "\n\n".join(rng.choice(paragraphs) for _ in range(count))
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                handle.write(line)
                written += len(line)
                in_file += len(line)
        file_index += 1
    return out

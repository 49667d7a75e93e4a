"""`read_documents`: the raw documents of one input, from the reader its format calls for."""

from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Any, Iterator, Optional

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.sources.columnar import arrow_batches, parquet_batches
from bertrain.data.sources.decode import BinaryFile, ByteProgress, iter_lines, open_binary
from bertrain.data.sources.hub import hub_batches
from bertrain.data.sources.json_records import json_array_records, json_line_records, starts_with_bracket
from bertrain.data.sources.lookup import InputFile, note_skipped
from bertrain.data.sources.pydoc import pydoc_source_documents
from bertrain.data.sources.records import column_records, record_documents
from bertrain.data.sources.text import text_documents
from bertrain.errors import ConfigError, DataError

COLUMN_READERS = {"parquet": parquet_batches, "arrow": arrow_batches, "hub": hub_batches}


def read_documents(item: InputFile, source: SourceConfig, config: PrepareConfig, counts: Counter,
                   skipped: list, progress: Optional[list] = None) -> Iterator[tuple]:
    """Raw documents of one input; updates counts. With `progress` (a list), its one item is set to the
    ByteProgress of the file being read (None for column formats)."""
    if progress is not None:
        progress[:] = [None]
    if source.group_by and item.format in ("text", "pydoc"):
        raise ConfigError(f"{item.path}: group_by applies to records (JSON lines, JSON, Parquet, datasets, hub), "
                          f"not to {item.format} files; remove group_by from the source '{source.path}' (with "
                          f"--source: --set prepare.sources.N.group_by=null) or set its format.")
    if item.format == "pydoc":
        counts["files_read"] += 1
        yield from pydoc_source_documents(item, counts)
        return
    if item.format in COLUMN_READERS:
        batches = COLUMN_READERS[item.format](item, source)
        counts["files_read"] += 1
        yield from record_documents(column_records(item, batches, source, config, counts), source, config, counts)
        return
    stream, raw = open_binary(item)
    if progress is not None:
        progress[:] = [ByteProgress(raw)]
    with stream, raw:
        yield from _line_documents(item, stream, source, config, counts, skipped)


def _line_documents(item: InputFile, stream: Any, source: SourceConfig, config: PrepareConfig, counts: Counter,
                    skipped: list) -> Iterator[tuple]:
    """Raw documents of an open text, JSON-lines or JSON file; binary, UTF-16/32 and empty files are counted."""
    try:
        if item.format == "json" and starts_with_bracket(stream):
            counts["files_read"] += 1
            yield from record_documents(json_array_records(item, stream, source, config, counts), source, config,
                                        counts)
            return
        limit = None if item.format in ("json", "jsonl") else config.max_line_chars
        lines = iter_lines(stream, item.path, limit, config.on_decode_error, counts)
        first = next(lines, None)
    except BinaryFile as unreadable:
        counts[f"files_skipped_{unreadable.reason}"] += 1
        note_skipped(skipped, item.path, unreadable.reason)
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
            yield from record_documents(json_line_records(item, lines, source, config, counts), source, config, counts)
        else:
            for document in text_documents(item, lines, source, config, counts):
                counts["documents_read"] += 1
                yield document
    except (OSError, EOFError) as error:
        raise DataError(f"Cannot read {item.path}: {error}. Is the file damaged or truncated?") from None

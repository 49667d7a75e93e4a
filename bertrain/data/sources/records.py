"""What the record readers (JSON, Parquet, datasets, hub) share: the text field, bad records, and
grouping consecutive records into documents (a source's `group_by`)."""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Any, Iterator, Optional

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.sources.lookup import InputFile
from bertrain.errors import DataError

RECORD_BATCH = 1024  # column values per batch read from Parquet, datasets and the hub
FIX_FIELD = "Fix the data, set the source's text_field, or skip such records with --set prepare.on_bad_record=skip."
FIX_GROUP_BY = ("Fix the data, correct the source's group_by (with --source: --set prepare.sources.N.group_by=[...]), "
                "or skip such records with --set prepare.on_bad_record=skip.")
MISSING = object()  # a group field the record lacks (None is a value: a field that is null)


def field_value(record: Any, dotted: str, absent: Any = None) -> Any:
    """The value at a dotted path ("meta.body") in nested dicts, or `absent` when the path is not there."""
    for part in dotted.split("."):
        if not isinstance(record, dict) or part not in record:
            return absent
        record = record[part]
    return record


def group_fields(source: SourceConfig) -> list[str]:
    """The source's `group_by` fields as a list ([] when records are not grouped)."""
    if not source.group_by:
        return []
    return [source.group_by] if isinstance(source.group_by, str) else list(source.group_by)


def group_key(record: Any, fields: list[str]) -> tuple:
    """The values of the group fields of a record (MISSING where a field is absent)."""
    return tuple(field_value(record, name, MISSING) for name in fields)


def missing_group_field(key: tuple, fields: list[str]) -> Optional[str]:
    """The first group field a record's key lacks, or None."""
    return next((name for name, value in zip(fields, key) if value is MISSING), None)


def nearest_field_hint(record: Any, dotted: str) -> str:
    """For a field a record lacks: " Did you mean 'chapter'?" (the nearest name where the path stops), else the
    names there, so that a typo in text_field or group_by is easy to see."""
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(record, dict):
            return ""
        if part not in record:
            names = [str(name) for name in record]
            close = difflib.get_close_matches(part, names, n=1)
            if close:
                return f" Did you mean '{'.'.join(parts[:depth] + close)}'?"
            return f" Its fields: {', '.join(names[:10])}." if names else ""
        record = record[part]
    return ""


def bad_group_record(which: str, field: str, record: Any, config: PrepareConfig, counts: Counter,
                     source: SourceConfig) -> None:
    """A record (`which`: "FILE:LINE: record") lacking a group_by field: grouping it would put it in the wrong
    document."""
    hint = nearest_field_hint(record, field) if record is not None else ""
    bad_record(f"{which} has no '{field}' field (named in the source's group_by).{hint}", config, counts,
               source, fix=FIX_GROUP_BY)


def count_record(source: SourceConfig, counts: Counter) -> None:
    """Count one record read: a document, unless records are grouped (then each group is one)."""
    counts["records_read" if source.group_by else "documents_read"] += 1


def bad_record(message: str, config: PrepareConfig, counts: Counter, source: Optional[SourceConfig] = None,
               fix: str = FIX_FIELD) -> None:
    """A record without usable text: an error, or counted and skipped (prepare.on_bad_record)."""
    if config.on_bad_record == "error":
        raise DataError(f"{message} {fix}")
    if source is not None and source.group_by:
        counts["documents_read"] += 1  # a skipped record of a grouped source counts as a document read and skipped
    counts["documents_bad_record"] += 1


def grouped_documents(records: Iterator[tuple[tuple, str, str]], config: PrepareConfig,
                      counts: Counter) -> Iterator[tuple]:
    """"text" documents from records: consecutive equal keys joined, a group past max_document_chars cut."""
    texts: list[str] = []
    key: Any = None
    origin, size = "", 0
    for record_key, text, where in records:
        if texts and (record_key != key or size >= config.max_document_chars):
            if record_key == key:
                counts["documents_cut_long"] += 1
            counts["documents_read"] += 1
            yield "text", "\n\n".join(texts), origin
            texts, size = [], 0
        if not texts:
            key, origin = record_key, where
        texts.append(text)
        size += len(text) + 2
    if texts:
        counts["documents_read"] += 1
        yield "text", "\n\n".join(texts), origin


def record_documents(records: Iterator[tuple[tuple, str, str]], source: SourceConfig, config: PrepareConfig,
                     counts: Counter) -> Iterator[tuple]:
    """Raw "text" documents of (group key, text, origin) records: one a record, or grouped by `group_by`."""
    if source.group_by:
        yield from grouped_documents(records, config, counts)
    else:
        for _, text, where in records:
            yield "text", text, where


def column_records(item: InputFile, batches: Iterator[tuple[list, Optional[list]]], source: SourceConfig,
                   config: PrepareConfig, counts: Counter) -> Iterator[tuple[tuple, str, str]]:
    """(group key, text, origin) records from column batches; non-strings are bad records."""
    row = 0
    fields = group_fields(source)
    for values, keys in batches:
        for index, value in enumerate(values):
            count_record(source, counts)
            missing = missing_group_field(keys[index], fields) if keys is not None else None
            if not isinstance(value, str):
                bad_record(f"{item.path}: row {row} has a {type(value).__name__} in '{source.text_field}', "
                           f"not a string.", config, counts, source)
            elif missing is not None:
                bad_group_record(f"{item.path}: row {row}", missing, None, config, counts, source)
            else:
                yield (keys[index] if keys is not None else ()), value, f"{item.path}#{row}"
            row += 1

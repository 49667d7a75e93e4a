"""The JSON readers: JSON lines (one record a line) and a JSON array of records."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterator

from bertrain.config import PrepareConfig, SourceConfig
from bertrain.data.sources.lookup import InputFile
from bertrain.data.sources.records import (bad_group_record, bad_record, count_record, field_value, group_fields,
                                           group_key, missing_group_field, nearest_field_hint)
from bertrain.errors import DataError

# json's messages, most of which end in "at" before a position it adds itself, said plainly.
_JSON_PROBLEMS = {
    "Unterminated string starting at": "a string opened here is never closed (a missing quote, or a cut-off record)",
    "Expecting property name enclosed in double quotes": "expected a key in double quotes (JSON needs \"key\", "
                                                         "not 'key' or key; or a trailing comma)",
    "Expecting value": "expected a value here (a trailing comma, a cut-off record, or text that is not JSON)",
    "Extra data": "more than one JSON value (JSON lines needs exactly one record a line)",
    "Expecting ',' delimiter": "expected ',' between items (a cut-off record, or a missing comma)",
    "Expecting ':' delimiter": "expected ':' after a key",
    "Invalid control character at": "a raw control character (tab, newline) inside a string; escape it",
    "Invalid \\escape": "an invalid backslash escape in a string",
}


def json_problem(error: json.JSONDecodeError) -> str:
    """What is wrong, said plainly (json's own message when there is no plainer one)."""
    return _JSON_PROBLEMS.get(error.msg, error.msg.removesuffix(" at"))


def json_line_records(item: InputFile, lines: Iterator[tuple[int, str]], source: SourceConfig,
                      config: PrepareConfig, counts: Counter) -> Iterator[tuple[tuple, str, str]]:
    """(group key, text, origin) of each good record of a JSON-lines file; bad lines are bad records."""
    fields = group_fields(source)
    for number, line in lines:
        if not line.strip():
            continue
        count_record(source, counts)
        where = f"{item.path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            bad_record(f"{item.path}: line {number}, column {error.colno}: not valid JSON: {json_problem(error)}.",
                       config, counts, source, fix=f"Fix or remove line {number}, or skip lines that are not "
                       f"valid JSON with --set prepare.on_bad_record=skip.")
            continue
        text = field_value(record, source.text_field)
        if not isinstance(text, str):
            problem = "has no" if text is None else f"has a non-string ({type(text).__name__})"
            hint = nearest_field_hint(record, source.text_field) if text is None else ""
            bad_record(f"{where}: record {problem} '{source.text_field}' field.{hint}", config, counts, source)
            continue
        key = group_key(record, fields)
        missing = missing_group_field(key, fields)
        if missing is not None:
            bad_group_record(f"{where}: record", missing, record, config, counts, source)
            continue
        yield key, text, where


def starts_with_bracket(stream: Any) -> bool:
    """Whether a buffered stream's first non-blank byte is "[" (a JSON array, not JSON lines)."""
    if not hasattr(stream, "peek"):
        return False
    head = stream.peek(64).lstrip()
    return head[:1] == b"["


def _json_array(item: InputFile, stream: Any, config: PrepareConfig) -> list:
    """The records of a file holding one JSON array of records (or one record)."""
    raw = stream.read()
    try:
        records = json.loads(raw.decode("utf-8", "replace" if config.on_decode_error != "error" else "strict"))
    except UnicodeDecodeError as error:
        raise DataError(f"{item.path}: invalid UTF-8 at byte offset {error.start}. Set "
                        f"prepare.on_decode_error: replace to replace it.") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{item.path}: line {error.lineno}, column {error.colno}: not valid JSON: "
                        f"{json_problem(error)}. Fix the file (a .json file holds one JSON array of records; "
                        f"name JSON lines .jsonl).") from None
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list):
        raise DataError(f"{item.path}: expected a JSON array of records or JSON lines.")
    return records


def json_array_records(item: InputFile, stream: Any, source: SourceConfig, config: PrepareConfig,
                       counts: Counter) -> Iterator[tuple[tuple, str, str]]:
    """(group key, text, origin) of each good record of a file holding one JSON array of records (or one)."""
    fields = group_fields(source)
    for index, record in enumerate(_json_array(item, stream, config)):
        count_record(source, counts)
        text = field_value(record, source.text_field)
        if not isinstance(text, str):
            hint = nearest_field_hint(record, source.text_field) if text is None else ""
            bad_record(f"{item.path}: record {index} has no string '{source.text_field}' field.{hint}", config,
                       counts, source)
            continue
        key = group_key(record, fields)
        missing = missing_group_field(key, fields)
        if missing is not None:
            bad_group_record(f"{item.path}: record {index}", missing, record, config, counts, source)
            continue
        yield key, text, f"{item.path}#{index}"

"""Reading the examples of a fine-tuning task: rows of .jsonl, .csv, .tsv or .parquet files (each with the line it
came from, for errors), and the text and label columns taken from them, checked."""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bertrain.errors import DataError

FORMATS = (".jsonl", ".csv", ".tsv", ".parquet")
csv.field_size_limit(sys.maxsize)  # GLUE's and users' texts may exceed csv's 128 KiB default


@dataclass
class Examples:
    """One split of a task: texts (one or two per example), labels (class ids or numbers), and rows left out."""

    texts: list[tuple[str, ...]]
    labels: list
    skipped: list[str] = field(default_factory=list)  # "file:line: why" of each malformed row left out

    def __len__(self) -> int:
        return len(self.texts)

    def sha256(self) -> str:
        """sha256 of the texts and labels as read: changed rows, files or columns give another value."""
        digest = hashlib.sha256()
        for texts, label in zip(self.texts, self.labels):
            digest.update(json.dumps([texts, label]).encode() + b"\n")
        return digest.hexdigest()


def read_rows(path: Path, header: bool = True) -> Iterator[tuple[str, dict]]:
    """(where, record) of each row of a task file; a .tsv has no quoting (as GLUE's files); without `header` a
    delimited file's columns are named by their index ('0', '1', ...)."""
    if not path.is_file():
        raise DataError(f"Task file {path} does not exist.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # heavy: only Parquet task files need it

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises its own error types for unreadable files
            raise DataError(f"{path} is not a readable Parquet file: {error}") from None
        for index, row in enumerate(rows):
            yield f"{path}: row {index + 1}", row
    elif suffix == ".jsonl":
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8", Notepad) is no part of the first column's name.
        with open(path, encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}:{number}: not valid JSON ({error.msg}). Each line must be one "
                                    "JSON object.") from None
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{number}: a JSON {type(record).__name__}, not an object with the "
                                    "task's columns.")
                yield f"{path}:{number}", record
    elif suffix in (".csv", ".tsv"):
        options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if suffix == ".tsv" else {}
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, **options)
            names = next(reader, None) if header else None
            for values in reader:
                if not values:
                    continue
                keys = names if names is not None else [str(i) for i in range(len(values))]
                yield f"{path}:{reader.line_num}", dict(zip(keys, values))
    else:
        raise DataError(f"{path}: unknown task file format '{suffix}'; use one of {', '.join(FORMATS)}.")


def column_names(path: Path) -> list[str]:
    """The columns of a task file (its first row's keys), for messages."""
    first = next(read_rows(path), None)
    return list(first[1]) if first else []


def read_examples(path: Path, text_columns: list[str], label_column: str, to_label, skip_malformed: bool = False,
                  header: bool = True) -> Examples:
    """The examples of one file: `to_label(value, where)` turns a label into its id or number (or raises).
    `skip_malformed`: rows missing a column are left out and listed in `skipped` (GLUE's QQP has a few)."""
    texts, labels, skipped = [], [], []
    for where, row in read_rows(path, header):
        missing = [name for name in (*text_columns, label_column) if row.get(name) is None]
        if missing:
            if skip_malformed:
                skipped.append(f"{where}: no value for {', '.join(missing)}")
                continue
            known = ", ".join(str(name) for name in row)
            raise DataError(f"{where}: no value in column '{missing[0]}' (this row's columns: {known}). Fix the "
                            "row, or name the right columns in the task file's `text` and `label`.")
        values = [row[name] for name in text_columns]
        wrong = [name for name, value in zip(text_columns, values) if not isinstance(value, str)]
        if wrong:
            raise DataError(f"{where}: column '{wrong[0]}' holds {row[wrong[0]]!r}, not text.")
        texts.append(tuple(values))
        labels.append(to_label(row[label_column], where))
    if not texts:
        raise DataError(f"{path} holds no examples.")
    return Examples(texts, labels, skipped)


def float_label(value, where: str) -> float:
    """A regression target."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: label {value!r} is not a number (the task is a regression).") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise DataError(f"{where}: label {value!r} is not a finite number.")
    return number


def label_lookup(names: list[str]):
    """to_label for a fixed list of label names (GLUE's, or those of a training file): name → id."""
    ids = {name: i for i, name in enumerate(names)}

    def to_label(value, where: str) -> int:
        key = str(value).strip()
        if isinstance(value, bool):
            key = key.lower()
        if isinstance(value, float) and value.is_integer():
            key = str(int(value))
        if key not in ids:
            raise DataError(f"{where}: label {value!r} is not one of the task's labels ({', '.join(names)}); "
                            "a validation label must occur in the training file.")
        return ids[key]

    return to_label


def label_names(path: Path, label_column: str) -> list[str]:
    """A classification task's labels as found in its training file: integers in numeric order, else sorted text."""
    found, rows = set(), 0
    for where, row in read_rows(path):
        rows += 1
        value = row.get(label_column)
        if value is None:
            continue  # read_examples names the row
        if isinstance(value, float) and not value.is_integer():
            raise DataError(f"{where}: label {value!r} is a fraction; a classification label is a name or an "
                            "integer (use `kind: regression` for numbers).")
        found.add(str(value).lower() if isinstance(value, bool) else
                  str(int(value)) if isinstance(value, float) else str(value).strip())
    if not rows:
        raise DataError(f"{path} is empty: a training file needs examples, one per row. Fill it, or point the "
                        "task file's `train` at the right file.")
    if len(found) < 2:
        raise DataError(f"{path}: column '{label_column}' holds {len(found)} distinct label(s); a classification "
                        "task needs at least two.")
    if all(name.lstrip("-").isdigit() for name in found):
        return sorted(found, key=int)
    return sorted(found)

"""The columnar readers: Parquet files and `datasets.save_to_disk` directories, a text column in batches
(with the group fields' values when the source has `group_by`)."""

from __future__ import annotations

from typing import Iterator, Optional

from bertrain.config import SourceConfig
from bertrain.data.sources.lookup import InputFile
from bertrain.data.sources.records import RECORD_BATCH, group_fields, group_key
from bertrain.errors import DataError


def _columns(item: InputFile, source: SourceConfig, names: list[str]) -> list[str]:
    """The columns to read: the text column and the top-level columns of the group fields, checked."""
    if source.text_field not in names:
        raise DataError(f"{item.path}: no column '{source.text_field}' (columns: {', '.join(names)}). "
                        f"Set the source's text_field.")
    columns = [source.text_field]
    for field in group_fields(source):
        top = field.split(".")[0]
        if top not in names:
            raise DataError(f"{item.path}: no column '{top}' for group_by '{field}' (columns: "
                            f"{', '.join(names)}). Fix the source's group_by.")
        if top not in columns:
            columns.append(top)
    return columns


def _keys(rows: Optional[list[dict]], source: SourceConfig) -> Optional[list[tuple]]:
    """Group keys of a batch's rows, or None when the source does not group records."""
    if rows is None:
        return None
    fields = group_fields(source)
    return [group_key(row, fields) for row in rows]


def parquet_batches(item: InputFile, source: SourceConfig) -> Iterator[tuple[list, Optional[list]]]:
    """Batches of (text column values, group keys or None) of a Parquet file."""
    import pyarrow.parquet as pq  # heavy optional dependency: only Parquet sources need it

    try:
        parquet = pq.ParquetFile(item.path)
    except Exception as error:  # pyarrow raises several types for damaged files
        raise DataError(f"{item.path}: not a readable Parquet file ({error}).") from None
    columns = _columns(item, source, parquet.schema_arrow.names)
    for batch in parquet.iter_batches(batch_size=RECORD_BATCH, columns=columns):
        yield batch.column(0).to_pylist(), _keys(batch.to_pylist() if source.group_by else None, source)


def arrow_batches(item: InputFile, source: SourceConfig) -> Iterator[tuple[list, Optional[list]]]:
    """Batches of (text column values, group keys or None) of one split of a datasets directory."""
    import datasets  # heavy optional dependency (seconds to import): only datasets sources need it

    try:
        dataset = datasets.load_from_disk(item.path)
    except Exception as error:
        raise DataError(f"{item.path}: not a readable datasets directory ({error}).") from None
    if isinstance(dataset, datasets.DatasetDict):
        if source.split not in dataset:
            raise DataError(f"{item.path}: no split '{source.split}' (splits: {', '.join(dataset)}). "
                            f"Set the source's split.")
        dataset = dataset[source.split]
    columns = _columns(item, source, dataset.column_names)
    dataset = dataset.select_columns(columns)
    for batch in dataset.iter(batch_size=RECORD_BATCH):
        rows = [dict(zip(batch, values)) for values in zip(*batch.values())] if source.group_by else None
        yield batch[source.text_field], _keys(rows, source)

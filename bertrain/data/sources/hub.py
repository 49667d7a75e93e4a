"""The hub reader: `datasets.load_dataset` streaming (hub names, packaged builders with local data_files)."""

from __future__ import annotations

import os
import socket
from itertools import chain
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlparse

from bertrain.config import SourceConfig
from bertrain.data.sources.lookup import InputFile
from bertrain.data.sources.records import RECORD_BATCH, field_value, group_fields, group_key
from bertrain.errors import DataError

PACKAGED_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "webdataset", "imagefolder")


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds."""
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE or HF_DATASETS_OFFLINE tells `datasets` to use its cache only."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_batches(item: InputFile, source: SourceConfig) -> Iterator[tuple[list, Optional[list]]]:
    """Batches of (text field values, group keys or None) of a streamed `datasets.load_dataset` split."""
    # Short timeouts so a machine without network fails in seconds instead of hanging.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    offline = hub_offline()
    local = source.path in PACKAGED_BUILDERS or Path(source.path).exists()
    if not offline and not local and not hub_reachable():
        # datasets would retry for ~30 s before failing; say it at once.
        raise DataError(f"Cannot load dataset '{source.path}': the Hugging Face hub is not reachable (no "
                        f"network?). Download it on a machine with network and use `datasets.save_to_disk` "
                        f"(format: arrow), or point `data_files` at local files.")
    import datasets  # heavy optional dependency (seconds to import): only hub sources need it

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
    fields = group_fields(source)
    batch: list = []
    keys: Optional[list] = [] if fields else None
    for record in chain((first,), iterator):
        batch.append(field_value(record, source.text_field))
        if keys is not None:
            keys.append(group_key(record, fields))
        if len(batch) == RECORD_BATCH:
            yield batch, keys
            batch, keys = [], [] if fields else None
    if batch:
        yield batch, keys

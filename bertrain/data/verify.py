"""`bertrain inspect DATA_DIR --verify`: every shard's files against the sha256 its manifest record keeps (a disk
fault, a partial copy or a hand edit that np.load cannot see)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn, \
    TransferSpeedColumn
from rich.table import Table

from bertrain.data.format import open_prepared, shard_paths, shard_sha256
from bertrain.errors import DataError

MAX_NAMED = 8


def verify_prepared(data_dir: str | Path, console: Any) -> None:
    """Hash every shard and print a table per split; a DataError names the shards that differ and how to rebuild."""
    prepared = open_prepared(data_dir)  # the manifest's own fingerprint is checked here
    version = int(prepared.manifest["format_version"])
    shards = [(split, record) for split, entry in prepared.manifest["splits"].items() for record in entry["shards"]]
    unchecked = [f"{split}/{record['name']}" for split, record in shards if "sha256" not in record]
    if unchecked:
        raise DataError(f"{prepared.path}: the manifest keeps no checksum for {len(unchecked)} of {len(shards)} "
                        f"shards (prepared before bertrain kept them), so there is nothing to verify against. "
                        f"Prepare the corpus again into a new DATA_DIR to get them.")
    sizes = {(split, record["name"]): sum(path.stat().st_size for path in paths.values() if path.is_file())
             for split, record in shards
             for paths in [shard_paths(prepared.path / split, record["name"], version)]}
    damaged: list[str] = []
    checked = {split: [0, 0] for split in prepared.manifest["splits"]}  # split: [shards, bytes]
    columns = (TextColumn("[bold]verifying"), BarColumn(bar_width=20), TaskProgressColumn(), TransferSpeedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("verify", total=sum(sizes.values()))
        for split, record in shards:
            name = f"{split}/{record['name']}"
            try:
                if shard_sha256(prepared.path / split, record["name"], version,
                                on_bytes=lambda size: progress.advance(task, size)) != record["sha256"]:
                    damaged.append(name)
            except OSError as error:  # a missing or unreadable file
                damaged.append(f"{name} (unreadable: {error.strerror or error})")
            checked[split][0] += 1
            checked[split][1] += sizes[(split, record["name"])]
    table = Table(title=f"{prepared.path}: shard checksums")
    for column in ("split", "shards", "MB", "differ"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, (count, size) in checked.items():
        differ = sum(name.startswith(f"{split}/") for name in damaged)
        table.add_row(split, f"{count:,}", f"{size / 1e6:,.1f}", f"[red]{differ}[/]" if differ else "0")
    console.print(table)
    if damaged:
        named = ", ".join(damaged[:MAX_NAMED]) + (f" and {len(damaged) - MAX_NAMED} more" if len(damaged) > MAX_NAMED
                                                  else "")
        raise DataError(f"{prepared.path}: {len(damaged)} of {len(shards)} shards differ from their checksum: "
                        f"{named}. Delete their files (e.g. {prepared.path / damaged[0].split()[0]}.*) and run the "
                        f"same `bertrain prepare` command again: it rebuilds missing shards, with the same "
                        f"fingerprint when its work/ folder and inputs are unchanged.")
    console.print(f"All {len(shards)} shards match their checksums (fingerprint {prepared.fingerprint[:12]}).",
                  highlight=False)

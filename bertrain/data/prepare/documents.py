"""Stage 1, documents: read, normalize in the worker pool, drop empties and duplicates, split by content hash,
deal documents to size-balanced sentence-per-line shards (DATA_DIR/work/documents/{split}/shard-NNNNN.txt)."""

from __future__ import annotations

import heapq
import os
import shutil
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from bertrain.config import PrepareConfig
from bertrain.data.format import SPLITS
from bertrain.data.prepare.empty_corpus import no_training_documents
from bertrain.data.prepare.pool import Workers
from bertrain.data.prepare.progress import Rate, progress_bar
from bertrain.data.prepare.workdir import WORK, shard_name
from bertrain.data.sentences import require_splitter
from bertrain.data.sources.lookup import resolve_source
from bertrain.data.sources.normalize import normalize_batch
from bertrain.data.sources.read import read_documents
from bertrain.data.sources.text import GUESSED_LAYOUTS, guessed_layout_count
from bertrain.errors import UsageError

BATCH_CHARS = 1 << 19        # raw text per normalization task
BATCH_DOCUMENTS = 2048       # raw documents per normalization task, at most
MAX_IN_FLIGHT_PER_WORKER = 3

# Documents-stage counts that are skips, each a reason a read document is not written.
DOCUMENT_SKIPS = ("documents_bad_record", "documents_empty", "documents_duplicate", "documents_empty_after_tokenizing")


def unaccounted_documents(counts: Counter) -> int:
    """Documents read but neither written nor skipped for one of DOCUMENT_SKIPS: 0 unless there is a bug."""
    return counts["documents_read"] - counts["documents_written"] - sum(counts.get(r, 0) for r in DOCUMENT_SKIPS)


def resolve_inputs(config: PrepareConfig, counts: Counter, skipped: list) -> list[tuple[Any, list]]:
    """(source, its InputFiles) for every configured source; no sources at all is a usage error."""
    require_splitter(config.sentence_splitter)
    if not config.sources:
        raise UsageError("No sources to prepare: list them under prepare.sources in the recipe or pass "
                         "--source PATH (repeatable).")
    return [(source, resolve_source(source, counts, skipped)) for source in config.sources]


def raw_batches(inputs: list[tuple[Any, Any]], config: PrepareConfig, counts: Counter, skipped: list,
                on_bytes: Callable[[int], None], read_by_file: Optional[dict[str, int]] = None,
                text_layouts: Optional[list[dict[str, Any]]] = None) -> Iterator[list[tuple]]:
    """Batches of raw documents from every input, in order, counting what each file gave; `text_layouts` gets,
    per source whose text files `text_layout: auto` read, how many it read with each layout."""
    batch: list[tuple] = []
    size = 0
    for index, (source, items) in enumerate(inputs):
        guessed_before = {layout: counts[guessed_layout_count(layout)] for layout in GUESSED_LAYOUTS}
        taken = 0
        for item in items:
            progress: list = []
            done = 0
            read_before = counts["documents_read"]
            for document in read_documents(item, source, config, counts, skipped, progress):
                batch.append(document)
                size += len(document[1]) if document[0] == "text" else sum(map(len, document[1]))
                taken += 1
                if size >= BATCH_CHARS or len(batch) >= BATCH_DOCUMENTS:
                    position = progress[0].position() if progress and progress[0] else 0
                    if position > done:
                        on_bytes(position - done)
                        done = position
                    yield batch
                    batch, size = [], 0
                if source.max_documents is not None and taken >= source.max_documents:
                    break
            on_bytes(max(item.size - done, 0))
            if read_by_file is not None:
                read_by_file[item.path] = counts["documents_read"] - read_before
            if source.max_documents is not None and taken >= source.max_documents:
                counts["sources_truncated_max_documents"] += 1
                break
        guessed = {layout: counts[guessed_layout_count(layout)] - before for layout, before in guessed_before.items()}
        if text_layouts is not None and any(guessed.values()):
            text_layouts.append({"source": index, "path": source.path, **guessed})
    if batch:
        yield batch


def normalized_documents(batches: Iterator[list[tuple]], config: PrepareConfig, workers: Workers,
                         counts: Counter) -> Iterator[tuple[list[str], bytes]]:
    """(sentences, hash) of every raw document, normalized in the worker pool, in input order."""
    args = (config.min_sentence_chars, config.max_line_chars, config.sentence_splitter, config.sentence_language)
    done = (normalize_batch(batch, *args) for batch in batches) if workers.count <= 1 else \
        _in_pool(workers, batches, args)
    for results, batch_counts in done:
        counts.update(batch_counts)
        yield from results


def _in_pool(workers: Workers, batches: Iterator[list[tuple]], args: tuple) -> Iterator[tuple]:
    """normalize_batch's results in input order, a bounded number of batches in flight."""
    workers.start()
    pending: deque = deque()
    for batch in batches:
        pending.append(workers.executor.submit(normalize_batch, batch, *args))
        if len(pending) >= MAX_IN_FLIGHT_PER_WORKER * workers.count:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def is_validation(digest: bytes, fraction: float) -> bool:
    """Deterministic train/validation side of a document from its content hash."""
    return int.from_bytes(digest[8:16], "big") < fraction * 2.0 ** 64


def document_split(sentences: list[str], digest: bytes, config: PrepareConfig, seen: set[int],
                   counts: Counter) -> Optional[str]:
    """The split a normalized document goes to, or None (counted) when it is empty or a duplicate."""
    if not sentences:
        counts["documents_empty"] += 1
        return None
    if config.dedup:
        key = int.from_bytes(digest[:8], "big")
        if key in seen:
            counts["documents_duplicate"] += 1
            return None
        seen.add(key)  # 8-byte hashes only: memory grows with documents, not text
    return "validation" if is_validation(digest, config.validation_fraction) else "train"


class ShardWriters:
    """The stage's .tmp output files; each document goes to its split's smallest shard so far."""

    def __init__(self, work: Path, num_shards: int):
        self.files = {"train": [work / "train" / f"{shard_name(i)}.txt" for i in range(num_shards)],
                      "validation": [work / "validation" / f"{shard_name(0)}.txt"]}
        for split in SPLITS:
            (work / split).mkdir(parents=True, exist_ok=True)
        self.handles = {split: [open(path.with_name(path.name + ".tmp"), "w", encoding="utf-8", buffering=1 << 20)
                                for path in paths] for split, paths in self.files.items()}
        self.sizes = {split: [0] * len(paths) for split, paths in self.files.items()}
        self.documents = {split: [0] * len(paths) for split, paths in self.files.items()}
        self.smallest = {split: [(0, i) for i in range(len(paths))] for split, paths in self.files.items()}

    def write(self, split: str, sentences: list[str]) -> None:
        """Append a document (a sentence a line, then a blank line) to the split's smallest shard."""
        _, index = heapq.heappop(self.smallest[split])
        text = "\n".join(sentences) + "\n\n"
        self.handles[split][index].write(text)
        self.sizes[split][index] += len(text)
        heapq.heappush(self.smallest[split], (self.sizes[split][index], index))
        self.documents[split][index] += 1

    def close(self) -> None:
        """Close every file and give it its final name."""
        for split, split_handles in self.handles.items():
            for handle, path in zip(split_handles, self.files[split]):
                handle.close()
                os.replace(path.with_name(path.name + ".tmp"), path)

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """Name, documents and characters of every shard, by split."""
        return {split: [{"name": path.stem, "documents": self.documents[split][i], "chars": self.sizes[split][i]}
                        for i, path in enumerate(self.files[split])] for split in SPLITS}


def build_documents(out: Path, inputs: list[tuple[Any, Any]], config: PrepareConfig, workers: Workers,
                    counts: Counter, skipped: list, console: Any) -> dict[str, Any]:
    """Stage 1: write deduplicated, split, size-balanced shards of sentence-per-line documents."""
    work = out / WORK / "documents"
    if work.exists():
        shutil.rmtree(work)
    writers = ShardWriters(work, config.num_shards)
    seen: set[int] = set()
    total_bytes = sum(item.size for _, items in inputs for item in items)
    start = time.perf_counter()
    with progress_bar(console) as progress:
        task = progress.add_task("reading", total=total_bytes or None, docs=0, rate=0.0)
        rate = Rate()

        def on_bytes(amount: int) -> None:
            progress.update(task, advance=amount, docs=counts["documents_read"], rate=rate(counts["documents_read"]))

        read_by_file: dict[str, int] = {}
        text_layouts: list[dict[str, Any]] = []
        batches = raw_batches(inputs, config, counts, skipped, on_bytes, read_by_file, text_layouts)
        for sentences, digest in normalized_documents(batches, config, workers, counts):
            split = document_split(sentences, digest, config, seen, counts)
            if split is not None:
                writers.write(split, sentences)
                counts["sentences_written"] += len(sentences)
        progress.update(task, docs=counts["documents_read"], rate=rate(counts["documents_read"]))
    writers.close()
    if sum(writers.documents["train"]) == 0:
        raise no_training_documents(counts, sum(writers.documents["validation"]), config, inputs, skipped, read_by_file)
    return {"shards": writers.records(), "seconds": round(time.perf_counter() - start, 2),
            "text_layouts": text_layouts}

"""`bertrain prepare`: raw corpora -> tokenizer + tokenized, memory-mapped DATA_DIR.

Stages, each skipped when its output exists and was made from the same inputs and settings
(compared by a key hashed from source file sizes/mtimes and every setting that changes output):

  1. documents  read sources, clean, split sentences, drop empties and duplicates, split train /
                validation by document hash, deal documents to size-balanced shards
                -> DATA_DIR/work/documents/{train,validation}/shard-NNNNN.txt (BERT format)
  2. tokenizer  train on a seeded sample of the train documents (or copy --tokenizer PATH)
                -> DATA_DIR/tokenizer/
  3. shards     tokenize each shard in parallel workers -> DATA_DIR/{split}/shard-NNNNN.*.npy
                (written under temporary names and renamed, so a shard on disk is always whole)
  4. manifest   when every shard is done -> DATA_DIR/manifest.json; the intermediate text is removed

A job array runs `--shard-index i --num-shards n`: stages 1-2 run once under a file lock, each job
tokenizes its shard, and whichever job finishes last (or a final run without --shard-index)
writes the manifest.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import heapq
import json
import os
import shutil
import time
from collections import Counter, deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from bertrain.config import PrepareConfig, Recipe, TokenizerConfig
from bertrain.data import corpus
from bertrain.data.format import (SPLITS, file_sha256, open_prepared, shard_paths, token_dtype_for, write_atomic,
                                  write_manifest, write_shard)
from bertrain.errors import DataError, UsageError

STAGE_VERSION = 1            # bump when a change makes old intermediate outputs invalid
WORK = "work"
BATCH_CHARS = 1 << 19        # raw text per normalization task
ENCODE_BATCH_SENTENCES = 4096
MAX_IN_FLIGHT_PER_WORKER = 3

# Documents-stage counts that are skips, each a reason a read document is not written.
DOCUMENT_SKIPS = ("documents_bad_record", "documents_empty", "documents_duplicate",
                  "documents_empty_after_tokenizing")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _write_json(path: Path, data: Any) -> None:
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


# ----------------------------------------------------------------------------------------------
# Keys: what each stage's output depends on
# ----------------------------------------------------------------------------------------------


def documents_settings(config: PrepareConfig) -> dict[str, Any]:
    """Prepare settings that change the documents (workers does not)."""
    settings = dataclasses.asdict(config)
    settings.pop("workers")
    return settings


def tokenizer_settings(config: TokenizerConfig) -> dict[str, Any]:
    settings = dataclasses.asdict(config)
    settings.pop("path")
    return settings


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """An exclusive lock on DATA_DIR (concurrent runs and job-array tasks take turns)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".prepare.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory for the prepared data.")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()} - {".prepare.lock"}
        if entries and not entries & {"manifest.json", WORK}:
            raise UsageError(f"--out {out} exists and is not a bertrain DATA_DIR (it holds "
                             f"{', '.join(sorted(entries)[:5])}). Choose a new or empty directory.")


def _clear(out: Path, *names: str) -> None:
    for name in names:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


# ----------------------------------------------------------------------------------------------
# Workers
# ----------------------------------------------------------------------------------------------

_progress_queue = None


def _init_worker(queue: Any) -> None:
    global _progress_queue
    _progress_queue = queue
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; parallelism is the pool


def _report(amount: int) -> None:
    if _progress_queue is not None:
        _progress_queue.put(amount)


class Workers:
    """A lazily started spawn process pool (none at all with one worker), with a progress queue."""

    def __init__(self, count: int):
        self.count = count
        self.executor = None
        self.queue = None

    def start(self) -> None:
        if self.executor is None and self.count > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")
            self.queue = context.Queue()
            self.executor = ProcessPoolExecutor(self.count, mp_context=context, initializer=_init_worker,
                                                initargs=(self.queue,))

    def drain(self) -> int:
        total = 0
        if self.queue is not None:
            import queue as queue_module

            while True:
                try:
                    total += self.queue.get_nowait()
                except queue_module.Empty:
                    return total
        return total

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


# ----------------------------------------------------------------------------------------------
# Progress and reporting
# ----------------------------------------------------------------------------------------------


def _progress(console: Any) -> Any:
    """A progress bar with documents/s, MB/s (of input or of text to tokenize) and ETA."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn, \
        TransferSpeedColumn

    return Progress(TextColumn("[bold]{task.description:<10}"), BarColumn(bar_width=20), TaskProgressColumn(),
                    TextColumn("{task.fields[docs]:>9,} docs {task.fields[rate]:>7,.0f}/s"),
                    TransferSpeedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=False)


class _Rate:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, docs: int) -> float:
        return docs / max(time.perf_counter() - self.start, 1e-6)


# ----------------------------------------------------------------------------------------------
# Stage 1: documents
# ----------------------------------------------------------------------------------------------


def _raw_batches(inputs: list[tuple[Any, Any]], config: PrepareConfig, counts: Counter, skipped: list,
                 on_bytes: Callable[[int], None]) -> Iterator[list[tuple]]:
    """Batches of raw documents from every input, in order; reports compressed bytes consumed."""
    batch: list[tuple] = []
    size = 0
    for source, items in inputs:
        taken = 0
        for item in items:
            progress: list = []
            done = 0
            for document in corpus.read_documents(item, source, config, counts, skipped, progress):
                batch.append(document)
                size += len(document[1]) if document[0] == "text" else sum(map(len, document[1]))
                taken += 1
                if size >= BATCH_CHARS or len(batch) >= 2048:
                    position = progress[0].position() if progress and progress[0] else 0
                    if position > done:
                        on_bytes(position - done)
                        done = position
                    yield batch
                    batch, size = [], 0
                if source.max_documents is not None and taken >= source.max_documents:
                    break
            on_bytes(max(item.size - done, 0))
            if source.max_documents is not None and taken >= source.max_documents:
                counts["sources_truncated_max_documents"] += 1
                break
    if batch:
        yield batch


def _normalized(batches: Iterator[list[tuple]], config: PrepareConfig, workers: Workers,
                counts: Counter) -> Iterator[tuple[list[str], bytes]]:
    """Normalize batches in the worker pool (bounded number in flight, results in input order)."""
    args = (config.min_sentence_chars, config.max_line_chars)
    if workers.count <= 1:
        for batch in batches:
            results, batch_counts = corpus.normalize_batch(batch, *args)
            counts.update(batch_counts)
            yield from results
        return
    workers.start()
    pending: deque = deque()
    for batch in batches:
        pending.append(workers.executor.submit(corpus.normalize_batch, batch, *args))
        while len(pending) >= MAX_IN_FLIGHT_PER_WORKER * workers.count:
            results, batch_counts = pending.popleft().result()
            counts.update(batch_counts)
            yield from results
    while pending:
        results, batch_counts = pending.popleft().result()
        counts.update(batch_counts)
        yield from results


def is_validation(digest: bytes, fraction: float) -> bool:
    """Deterministic train/validation side of a document from its content hash."""
    return int.from_bytes(digest[8:16], "big") < fraction * 2.0 ** 64


def build_documents(out: Path, inputs: list[tuple[Any, Any]], config: PrepareConfig, workers: Workers,
                    counts: Counter, skipped: list, console: Any) -> dict[str, Any]:
    """Stage 1: write deduplicated, split, size-balanced shards of sentence-per-line documents."""
    work = out / WORK / "documents"
    if work.exists():
        shutil.rmtree(work)
    files = {"train": [work / "train" / f"{shard_name(i)}.txt" for i in range(config.num_shards)],
             "validation": [work / "validation" / f"{shard_name(0)}.txt"]}
    for split in SPLITS:
        (work / split).mkdir(parents=True, exist_ok=True)
    handles = {split: [open(path.with_name(path.name + ".tmp"), "w", encoding="utf-8", buffering=1 << 20)
                       for path in paths] for split, paths in files.items()}
    sizes = {split: [0] * len(paths) for split, paths in files.items()}
    documents = {split: [0] * len(paths) for split, paths in files.items()}
    smallest = {split: [(0, i) for i in range(len(paths))] for split, paths in files.items()}
    seen: set[int] = set()  # 8-byte hashes only: memory grows with documents, not text
    total_bytes = sum(item.size for _, items in inputs for item in items)
    start = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("reading", total=total_bytes or None, docs=0, rate=0.0)
        rate = _Rate()
        read_docs = 0

        def on_bytes(amount: int) -> None:
            progress.update(task, advance=amount, docs=counts["documents_read"], rate=rate(counts["documents_read"]))

        batches = _raw_batches(inputs, config, counts, skipped, on_bytes)
        for sentences, digest in _normalized(batches, config, workers, counts):
            read_docs += 1
            if not sentences:
                counts["documents_empty"] += 1
                continue
            if config.dedup:
                key = int.from_bytes(digest[:8], "big")
                if key in seen:
                    counts["documents_duplicate"] += 1
                    continue
                seen.add(key)
            split = "validation" if is_validation(digest, config.validation_fraction) else "train"
            _, index = heapq.heappop(smallest[split])  # deal to the smallest shard so far
            text = "\n".join(sentences) + "\n\n"
            handles[split][index].write(text)
            sizes[split][index] += len(text)
            heapq.heappush(smallest[split], (sizes[split][index], index))
            documents[split][index] += 1
            counts["sentences_written"] += len(sentences)
        progress.update(task, docs=counts["documents_read"], rate=rate(counts["documents_read"]))
    for split, split_handles in handles.items():
        for handle, path in zip(split_handles, files[split]):
            handle.close()
            os.replace(path.with_name(path.name + ".tmp"), path)
    if counts["documents_read"] != read_docs + counts["documents_bad_record"]:
        raise RuntimeError("document counts do not add up (a bug): "
                           f"{counts['documents_read']} read, {read_docs} normalized")
    if sum(documents["train"]) == 0:
        reasons = ", ".join(f"{key.removeprefix('documents_')}: {counts[key]}" for key in DOCUMENT_SKIPS if counts[key])
        raise DataError(f"No training documents left after reading {counts['documents_read']} documents "
                        f"({reasons or 'nothing readable'}; files skipped: "
                        f"{counts['files_skipped_binary']} binary, {counts['files_empty']} empty).")
    return {
        "shards": {split: [{"name": path.stem, "documents": documents[split][i], "chars": sizes[split][i]}
                           for i, path in enumerate(files[split])] for split in SPLITS},
        "seconds": round(time.perf_counter() - start, 2),
    }


# ----------------------------------------------------------------------------------------------
# Stage 2: tokenizer
# ----------------------------------------------------------------------------------------------


def iter_document_texts(path: Path) -> Iterator[str]:
    """Documents of a stage-1 file, each as its sentences joined by newlines."""
    lines: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line == "\n":
                if lines:
                    yield "".join(lines)
                    lines = []
            else:
                lines.append(line)
    if lines:
        yield "".join(lines)


def in_sample(text: str, keep: float, seed: int) -> bool:
    """Whether a document belongs to the seeded tokenizer-training sample (kept with probability keep)."""
    if keep >= 1.0:
        return True
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "big", signed=True))
    return int.from_bytes(digest.digest(), "big") < keep * 2.0 ** 64


def sample_documents(paths: list[Path], total_chars: int, config: TokenizerConfig) -> Iterator[str]:
    """A seeded sample of documents of at most config.max_bytes (each kept with one probability)."""
    keep = min(1.0, config.max_bytes / max(total_chars, 1))
    used = 0
    for path in paths:
        for text in iter_document_texts(path):
            if not in_sample(text, keep, config.seed):
                continue
            used += len(text)
            if used > config.max_bytes:
                return
            yield text


def train_tokenizer_from_recipe(recipe: Recipe, out_dir: str | Path, console: Any = None) -> dict[str, Any]:
    """`bertrain tokenizer train`: read and clean the recipe's sources as prepare does, hold out the
    validation documents (by hash) for the unknown-token rate, and train on a seeded sample."""
    from rich.console import Console

    from bertrain.data.tokenizer import train_tokenizer

    console = console or Console(stderr=True, quiet=True)
    config, tokenizer_config = recipe.prepare, recipe.tokenizer
    counts: Counter = Counter()
    skipped: list = []
    inputs = _resolve_inputs(config, counts, skipped)
    total = sum(item.size for _, items in inputs for item in items)
    keep = min(1.0, tokenizer_config.max_bytes / total) if total else 1.0
    validation: list[str] = []
    validation_chars = 0
    seen: set[int] = set()

    def texts() -> Iterator[str]:
        nonlocal validation_chars
        batches = _raw_batches(inputs, config, counts, skipped, lambda amount: None)
        for sentences, digest in _normalized(batches, config, Workers(1), counts):
            if not sentences:
                continue
            key = int.from_bytes(digest[:8], "big")
            if config.dedup and key in seen:
                continue
            seen.add(key)
            if is_validation(digest, config.validation_fraction):
                if validation_chars < 10_000_000:  # a running total: summing the list each time is quadratic
                    validation.extend(sentences)
                    validation_chars += sum(map(len, sentences))
                continue
            text = "\n".join(sentences)
            if in_sample(text, keep, tokenizer_config.seed):
                yield text

    with console.status(f"Training the {tokenizer_config.kind} tokenizer (vocab {tokenizer_config.vocab_size:,})..."):
        stats = train_tokenizer(texts(), tokenizer_config, out_dir, validation_texts=validation)
    stats["validation_sentences"] = len(validation)
    return stats


def build_tokenizer(out: Path, documents: dict[str, Any], config: TokenizerConfig, tokenizer_path: Optional[str],
                    console: Any) -> dict[str, Any]:
    """Stage 2: train a tokenizer on the train documents, or copy an existing one."""
    from bertrain.data import tokenizer as tok

    target = out / "tokenizer"
    if target.exists():
        shutil.rmtree(target)
    if tokenizer_path:
        loaded = tok.load_tokenizer(tokenizer_path)
        kind = tok.tokenizer_kind(loaded)
        normalizer = json.loads(loaded.to_str()).get("normalizer") or {}
        tok.save_tokenizer(loaded, target, kind, lowercase=bool(normalizer.get("lowercase", False)))
        console.print(f"Using the existing {kind} tokenizer {tokenizer_path} "
                      f"({loaded.get_vocab_size():,} tokens).")
        return {"kind": kind, "vocab_size": loaded.get_vocab_size(), "source": str(tokenizer_path),
                "sha256": file_sha256(target / "tokenizer.json")}
    paths = [out / WORK / "documents" / "train" / f"{s['name']}.txt" for s in documents["shards"]["train"]]
    total = sum(s["chars"] for s in documents["shards"]["train"])
    with console.status(f"Training the {config.kind} tokenizer (vocab {config.vocab_size:,}) on "
                        f"{min(total, config.max_bytes) / 1e6:,.1f} MB of text..."):
        stats = tok.train_tokenizer(sample_documents(paths, total, config), config, target)
    if stats["vocab_size"] < config.vocab_size:
        console.print(f"[yellow]Note:[/] the corpus supports only {stats['vocab_size']:,} of the "
                      f"{config.vocab_size:,} requested tokens; the vocabulary is smaller (the manifest "
                      f"records the real size, which training uses).")
    return stats


# ----------------------------------------------------------------------------------------------
# Stage 3: tokenized shards
# ----------------------------------------------------------------------------------------------


def tokenize_shard(documents_path: str, split_dir: str, name: str, tokenizer_dir: str, vocab_size: int,
                   unk_id: int, record_path: str, key: str) -> dict[str, Any]:
    """Tokenize one stage-1 file into a shard (tokens, sentence and document offsets) plus a record."""
    from itertools import chain

    from bertrain.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    dtype = token_dtype_for(vocab_size)
    split_path = Path(split_dir)
    split_path.mkdir(parents=True, exist_ok=True)
    raw_tokens = split_path / f"{name}.tokens.raw.tmp"
    lengths: list[np.ndarray] = []
    owners: list[np.ndarray] = []   # document index of every kept sentence
    stats = Counter()
    batch: list[str] = []
    batch_owner: list[int] = []
    document = 0

    def flush(out: Any) -> None:
        id_lists = [encoding.ids for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False)]
        sizes = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(chain.from_iterable(id_lists), dtype=dtype, count=int(sizes.sum()))
        ids.tofile(out)
        keep = sizes > 0
        lengths.append(sizes[keep])
        owners.append(np.asarray(batch_owner, dtype=np.int64)[keep])
        stats["sentences_empty_after_tokenizing"] += int((~keep).sum())
        stats["unknown_tokens"] += int(np.count_nonzero(ids == unk_id))
        stats["words"] += sum(s.count(" ") for s in batch) + len(batch)
        chars = sum(len(s) for s in batch) + len(batch)
        stats["chars"] += chars
        _report(chars)
        batch.clear()
        batch_owner.clear()

    with open(documents_path, encoding="utf-8") as handle, open(raw_tokens, "wb") as out:
        previous_blank = True
        for line in handle:
            if line == "\n":
                if not previous_blank:
                    document += 1
                previous_blank = True
                continue
            previous_blank = False
            batch.append(line[:-1])
            batch_owner.append(document)
            if len(batch) >= ENCODE_BATCH_SENTENCES:
                flush(out)
        if batch:
            flush(out)
    if not previous_blank:
        document += 1
    sentence_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    per_document = np.bincount(owner, minlength=document)
    stats["documents_empty_after_tokenizing"] = int(np.count_nonzero(per_document == 0))
    sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64)
    document_offsets = np.concatenate([[0], np.cumsum(per_document[per_document > 0])]).astype(np.int64)
    count = int(sentence_offsets[-1])
    tokens = np.memmap(raw_tokens, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    record = write_shard(split_path, name, tokens, sentence_offsets, document_offsets)
    del tokens
    raw_tokens.unlink()
    record.update({key_: int(value) for key_, value in stats.items()})
    _write_json(Path(record_path), {"key": key, **record})
    return record


def _shard_record(out: Path, split: str, name: str, key: str) -> Optional[dict]:
    record = _read_json(out / WORK / "shards" / f"{split}-{name}.json")
    if record is None or record.get("key") != key:
        return None
    if not all(path.is_file() for path in shard_paths(out / split, name).values()):
        return None
    return record


def _pending_shards(out: Path, documents: dict[str, Any], key: str,
                    only: Optional[list[tuple[str, str]]] = None) -> list[tuple[str, dict]]:
    """(split, shard) of every shard without a complete output for `key` (among `only`, if given)."""
    return [(split, shard) for split in SPLITS for shard in documents["shards"][split]
            if (only is None or (split, shard["name"]) in only)
            and _shard_record(out, split, shard["name"], key) is None]


def build_shards(out: Path, documents: dict[str, Any], facts: dict[str, Any],
                 key: str, only: Optional[list[tuple[str, str]]], workers: Workers, console: Any) -> None:
    """Stage 3: tokenize every shard not already done (or only the listed ones), in parallel."""
    (out / WORK / "shards").mkdir(parents=True, exist_ok=True)
    todo = _pending_shards(out, documents, key, only)
    if not todo:
        return
    todo.sort(key=lambda item: -item[1]["chars"])  # largest first: better packing over workers
    total = sum(shard["chars"] for _, shard in todo)
    arguments = [(str(out / WORK / "documents" / split / f"{shard['name']}.txt"), str(out / split), shard["name"],
                  str(out / "tokenizer"), facts["vocab_size"], facts["special_tokens"]["unk"],
                  str(out / WORK / "shards" / f"{split}-{shard['name']}.json"), key) for split, shard in todo]
    global _progress_queue
    with _progress(console) as progress:
        task = progress.add_task("tokenizing", total=total or None, docs=0, rate=0.0)
        rate = _Rate()
        done_docs = 0
        if workers.count <= 1 or len(todo) == 1:
            for (split, shard), args in zip(todo, arguments):
                _progress_queue = _LocalQueue(lambda n: progress.update(task, advance=n))
                try:
                    tokenize_shard(*args)
                finally:
                    _progress_queue = None
                done_docs += shard["documents"]
                progress.update(task, docs=done_docs, rate=rate(done_docs))
            return
        workers.start()
        futures = {workers.executor.submit(tokenize_shard, *args): shard for (split, shard), args in zip(todo, arguments)}
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()
                done_docs += futures[future]["documents"]
            progress.update(task, advance=workers.drain(), docs=done_docs, rate=rate(done_docs))


class _LocalQueue:
    def __init__(self, callback: Callable[[int], None]):
        self.put = callback


# ----------------------------------------------------------------------------------------------
# Stage 4: manifest
# ----------------------------------------------------------------------------------------------


def build_manifest(out: Path, documents: dict[str, Any], tokenizer_stats: dict[str, Any], facts: dict[str, Any],
                   key: str, settings: dict[str, Any], sources: list[dict], counts: Counter,
                   skipped: list) -> dict[str, Any]:
    """Stage 4: gather shard records into manifest.json (no timings: same inputs, same fingerprint)."""
    counts = Counter(counts)
    splits: dict[str, Any] = {}
    shard_totals = Counter()
    for split in SPLITS:
        records = []
        for shard in documents["shards"][split]:
            record = _shard_record(out, split, shard["name"], key)
            if record is None:
                raise DataError(f"{out}: shard {split}/{shard['name']} is not complete; run prepare again.")
            for field in ("sentences_empty_after_tokenizing", "documents_empty_after_tokenizing",
                          "unknown_tokens", "words", "chars"):
                shard_totals[f"{split}_{field}"] += record.get(field, 0)
            if record["documents"] or (split == "validation" and not records):
                records.append({k: record[k] for k in ("name", "documents", "sentences", "tokens")})
        splits[split] = {"shards": records, "documents": sum(r["documents"] for r in records),
                         "sentences": sum(r["sentences"] for r in records),
                         "tokens": sum(r["tokens"] for r in records)}
    for field in ("documents_empty_after_tokenizing", "sentences_empty_after_tokenizing"):
        counts[field] = shard_totals[f"train_{field}"] + shard_totals[f"validation_{field}"]
    counts["documents_train"] = splits["train"]["documents"]
    counts["documents_validation"] = splits["validation"]["documents"]
    counts["documents_written"] = counts["documents_train"] + counts["documents_validation"]
    counts["sentences_written"] = splits["train"]["sentences"] + splits["validation"]["sentences"]
    counts["tokens_written"] = splits["train"]["tokens"] + splits["validation"]["tokens"]
    skips = sum(counts[reason] for reason in DOCUMENT_SKIPS)
    if counts["documents_read"] != counts["documents_written"] + skips:
        raise RuntimeError(f"document counts do not add up (a bug): read {counts['documents_read']}, "
                           f"written {counts['documents_written']}, skipped {skips}")
    measured = "validation" if splits["validation"]["tokens"] else "train"
    tokens = splits[measured]["tokens"]
    stats = dict(tokenizer_stats)
    stats.pop("training_seconds", None)
    stats.update({
        "measured_on": measured,
        "unk_rate": shard_totals[f"{measured}_unknown_tokens"] / tokens if tokens else 0.0,
        "tokens_per_word": tokens / shard_totals[f"{measured}_words"] if shard_totals[f"{measured}_words"] else 0.0,
    })
    manifest = {
        "tokenizer": {**facts, "stats": stats},
        "token_dtype": token_dtype_for(facts["vocab_size"]).name,
        "splits": splits,
        "sources": sources,
        "counts": dict(sorted((k, v) for k, v in counts.items() if v or k in ("documents_read",))),
        "skipped_files": skipped,
        "settings": {**settings, "input_key": key},
    }
    return write_manifest(out, manifest)


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------


def _resolve_inputs(config: PrepareConfig, counts: Counter, skipped: list) -> list[tuple[Any, list]]:
    if not config.sources:
        raise UsageError("No sources to prepare: list them under prepare.sources in the recipe or pass "
                         "--source PATH (repeatable).")
    return [(source, corpus.resolve_source(source, counts, skipped)) for source in config.sources]


def prepare_corpus(recipe: Recipe, out_dir: str | Path, *, workers: Optional[int] = None,
                   shard_index: Optional[int] = None, num_shards: Optional[int] = None,
                   tokenizer_path: Optional[str] = None, console: Any = None) -> dict[str, Any]:
    """Prepare DATA_DIR from a recipe; return the manifest (or, for a job-array task whose siblings
    are still running, a status dict with `complete: False`)."""
    from rich.console import Console

    console = console or Console(stderr=True, quiet=True)
    started = time.perf_counter()
    config = dataclasses.replace(recipe.prepare)
    tokenizer_config = dataclasses.replace(recipe.tokenizer)
    if workers is not None:
        config.workers = workers
    if num_shards is not None:
        config.num_shards = num_shards
    if tokenizer_path is not None:
        tokenizer_config.path = tokenizer_path
    if config.workers < 1 or config.num_shards < 1:
        raise UsageError("workers and num_shards must be at least 1.")
    if shard_index is not None and not 0 <= shard_index < config.num_shards:
        raise UsageError(f"--shard-index {shard_index} is outside 0..{config.num_shards - 1} "
                         f"(--num-shards {config.num_shards}).")
    out = Path(out_dir)
    _check_out_dir(out)

    counts: Counter = Counter()
    skipped: list = []
    inputs = _resolve_inputs(config, counts, skipped)
    sources = [item.record() for _, items in inputs for item in items]
    documents_key = _hash({"version": STAGE_VERSION, "settings": documents_settings(config),
                           "inputs": [[item.path, item.format, item.size, item.mtime_ns]
                                      for _, items in inputs for item in items]})
    if tokenizer_config.path:
        from bertrain.data.tokenizer import tokenizer_file

        tokenizer_path_file = tokenizer_file(tokenizer_config.path)
        if not tokenizer_path_file.is_file():
            raise DataError(f"--tokenizer {tokenizer_config.path}: no tokenizer.json there.")
        tokenizer_source = {"path": str(tokenizer_config.path), "sha256": file_sha256(tokenizer_path_file)}
    else:
        tokenizer_source = tokenizer_settings(tokenizer_config)
    key = _hash({"documents": documents_key, "tokenizer": tokenizer_source})
    settings = {"prepare": documents_settings(config), "tokenizer": tokenizer_source}

    manifest = _read_json(out / "manifest.json")
    if manifest is not None and manifest.get("settings", {}).get("input_key") == key:
        try:
            prepared = open_prepared(out)
            for split in SPLITS:
                prepared.split(split)
            console.print(f"{out} is up to date (fingerprint {prepared.fingerprint[:12]}); nothing to do.")
            return prepared.manifest
        except DataError:
            console.print(f"{out}: the prepared data is incomplete or damaged; rebuilding what is missing.")
            _clear(out, "manifest.json")

    only = None
    if shard_index is not None:
        only = [("train", shard_name(shard_index))] + ([("validation", shard_name(0))] if shard_index == 0 else [])
    pool = Workers(config.workers)
    timings: dict[str, float] = {}

    def run_documents() -> dict[str, Any]:
        built = build_documents(out, inputs, config, pool, counts, skipped, console)
        record = {"key": documents_key, "counts": dict(counts), "skipped_files": skipped, **built}
        _write_json(out / WORK / "documents.json", record)
        timings["documents"] = built["seconds"]
        return record

    try:
        with _locked(out):
            work = out / WORK
            work.mkdir(parents=True, exist_ok=True)
            documents = _read_json(work / "documents.json")
            if documents is None or documents.get("key") != documents_key:
                if documents is not None or (out / "manifest.json").exists():
                    console.print("Sources or settings changed since the last run: rebuilding everything.")
                _clear(out, "manifest.json", "tokenizer", "train", "validation", f"{WORK}/tokenizer.json",
                       f"{WORK}/shards", f"{WORK}/documents.json")
                documents = run_documents()
            tokenizer_record = _read_json(work / "tokenizer.json")
            tokenizer_done = tokenizer_record is not None and tokenizer_record.get("key") == key
            pending = _pending_shards(out, documents, key, only)
            if (not tokenizer_done or pending) and not (work / "documents").is_dir():
                # The last run finished and removed its intermediate text; reading again gives the
                # same documents (everything is deterministic), so finished outputs stay valid.
                console.print("Reading the sources again (the intermediate documents were removed).")
                documents = run_documents()
            elif "documents" not in timings:
                console.print("Documents: already done (same sources and settings).")
            counts, skipped = Counter(documents["counts"]), documents["skipped_files"]

            if not tokenizer_done:
                _clear(out, "manifest.json", "train", "validation", f"{WORK}/shards")
                tick = time.perf_counter()
                stats = build_tokenizer(out, documents, tokenizer_config, tokenizer_config.path, console)
                timings["tokenizer"] = time.perf_counter() - tick
                tokenizer_record = {"key": key, "stats": stats}
                _write_json(work / "tokenizer.json", tokenizer_record)
            else:
                console.print("Tokenizer: already done.")
        from bertrain.data.tokenizer import load_tokenizer, tokenizer_facts

        loaded = load_tokenizer(out / "tokenizer")
        stats = tokenizer_record["stats"]
        facts = tokenizer_facts(loaded, stats["kind"], stats["sha256"])
        if facts["special_tokens"] != {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}:
            console.print(f"[yellow]Warning:[/] this tokenizer's special-token ids are {facts['special_tokens']}, "
                          f"not bertrain's usual 0-4; the manifest records them.")

        tick = time.perf_counter()
        build_shards(out, documents, facts, key, only, pool, console)
        timings["tokenize"] = time.perf_counter() - tick
    finally:
        pool.close()

    with _locked(out):
        pending = [f"{split}/{shard['name']}" for split, shard in _pending_shards(out, documents, key)]
        if pending:
            if not (out / WORK / "documents").is_dir():
                raise DataError(f"{out}: shards {', '.join(pending[:4])} are missing and the intermediate "
                                f"documents were removed; run prepare again without --shard-index to rebuild.")
            console.print(f"Shard {shard_index} done; {len(pending)} shard(s) still to do. The manifest is "
                          f"written by the last job, or by `bertrain prepare` without --shard-index.")
            return {"complete": False, "pending_shards": pending}
        existing = _read_json(out / "manifest.json")
        if existing is None or existing.get("settings", {}).get("input_key") != key:
            manifest = build_manifest(out, documents, stats, facts, key, settings, sources, counts, skipped)
        else:
            manifest = open_prepared(out).manifest
        shutil.rmtree(out / WORK / "documents", ignore_errors=True)
    report(manifest, out, console, time.perf_counter() - started, timings)
    return manifest


# ----------------------------------------------------------------------------------------------
# The closing table
# ----------------------------------------------------------------------------------------------


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def report(manifest: dict[str, Any], out: Path, console: Any, seconds: float, timings: dict[str, float]) -> None:
    """Print counts, skips by reason, tokenizer facts, output size and time."""
    from rich.table import Table

    counts = manifest["counts"]
    splits = manifest["splits"]
    table = Table(title=f"Prepared {out}", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = [
        ("files read", counts.get("files_read", 0)),
        ("documents read", counts.get("documents_read", 0)),
        ("documents written: train", splits["train"]["documents"]),
        ("documents written: validation", splits["validation"]["documents"]),
    ]
    for reason in DOCUMENT_SKIPS:
        rows.append((f"documents skipped: {reason.removeprefix('documents_').replace('_', ' ')}", counts.get(reason, 0)))
    for name, label in (("files_skipped_binary", "files skipped: binary (NUL bytes)"),
                        ("files_skipped_unknown_format", "files skipped: unknown format"),
                        ("files_empty", "files empty"),
                        ("lines_decode_replaced", "lines with invalid UTF-8 replaced"),
                        ("lines_decode_skipped", "lines with invalid UTF-8 skipped"),
                        ("lines_split_long", "long lines split"),
                        ("sentences_split_long", "long sentences split"),
                        ("documents_cut_long", "long documents cut"),
                        ("sentences_short_dropped", "sentences dropped: too short"),
                        ("sentences_empty_after_tokenizing", "sentences dropped: no tokens")):
        if counts.get(name):
            rows.append((label, counts[name]))
    rows += [("sentences", counts.get("sentences_written", 0)),
             ("tokens: train", splits["train"]["tokens"]), ("tokens: validation", splits["validation"]["tokens"])]
    for label, value in rows:
        table.add_row(label, f"{value:,}")
    tokenizer = manifest["tokenizer"]
    stats = tokenizer.get("stats", {})
    table.add_row("tokenizer", f"{tokenizer['kind']} ({tokenizer['word_marker']}), {tokenizer['vocab_size']:,} tokens")
    table.add_row(f"unknown-token rate ({stats.get('measured_on', '?')})", f"{stats.get('unk_rate', 0):.4%}")
    table.add_row(f"tokens per word ({stats.get('measured_on', '?')})", f"{stats.get('tokens_per_word', 0):.3f}")
    table.add_row("output size", f"{directory_bytes(out) / 1e6:,.1f} MB")
    table.add_row("time", f"{seconds:,.1f} s" + (" (" + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()) + ")"
                                                   if timings else ""))
    console.print(table)
    if manifest.get("skipped_files"):
        names = ", ".join(f"{s['path']} ({s['reason']})" for s in manifest["skipped_files"][:10])
        console.print(f"Skipped files: {names}" + (" ..." if len(manifest["skipped_files"]) > 10 else ""))

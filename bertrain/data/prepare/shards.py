"""Stage 3, shards: tokenize each stage-1 file in the worker pool into DATA_DIR/{split}/shard-NNNNN.*.npy
(temporary names, then renamed), with a record of its counts in DATA_DIR/work/shards/."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import FIRST_COMPLETED, wait
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, TextIO

import numpy as np

from bertrain.data.format import SPLITS, shard_paths, token_dtype_for, write_shard
from bertrain.data.masking import word_tables
from bertrain.data.prepare.pool import Workers, local_progress, report_progress
from bertrain.data.prepare.progress import Rate, progress_bar
from bertrain.data.prepare.workdir import WORK, read_json, write_json
from bertrain.data.word_units import WordSegmenter, document_language, encode, word_starts_for
from bertrain.files import exclusive_lock
from bertrain.tokenizer_file import corpus_tokenizer

ENCODE_BATCH_SENTENCES = 4096


def _documents(handle: TextIO) -> Iterator[list[str]]:
    """The documents of a stage-1 file, each as its sentences (lines); blank lines end documents."""
    sentences: list[str] = []
    for line in handle:
        if line == "\n":
            if sentences:
                yield sentences
            sentences = []
        else:
            sentences.append(line[:-1])
    if sentences:
        yield sentences


class _SentenceEncoder:
    """Encodes sentences in batches to a raw token file and their word starts (one byte per token) to another,
    keeping lengths and documents and counting as it goes."""

    def __init__(self, tokenizer: Any, dtype: np.dtype, unk_id: int, out: BinaryIO,
                 tables: tuple[np.ndarray, ...], starts_out: BinaryIO):
        self.tokenizer, self.dtype, self.unk_id, self.out = tokenizer, dtype, unk_id, out
        self.tables, self.starts_out = tables, starts_out  # see masking.word_tables
        self.segmenter = WordSegmenter()
        self.batch_language: list[Optional[str]] = []
        self.lengths: list[np.ndarray] = []
        self.owners: list[np.ndarray] = []   # document index of every kept sentence
        self.stats: Counter = Counter()
        self.batch: list[str] = []
        self.batch_owner: list[int] = []
        self.documents = 0

    def add(self, sentence: str, document: int, language: Optional[str]) -> None:
        self.batch.append(sentence)
        self.batch_owner.append(document)
        self.batch_language.append(language)
        self.documents = document + 1
        if len(self.batch) >= ENCODE_BATCH_SENTENCES:
            self.flush()

    def flush(self) -> None:
        batch = self.batch
        if not batch:
            return
        id_lists, offsets = encode(self.tokenizer, batch, self.batch_language)
        sizes = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(chain.from_iterable(id_lists), dtype=self.dtype, count=int(sizes.sum()))
        ids.tofile(self.out)
        starts, segmented_words = word_starts_for(batch, self.batch_language, ids, sizes, offsets,
                                                  self.tables, self.segmenter)
        starts.astype(np.uint8).tofile(self.starts_out)
        keep = sizes > 0
        self.lengths.append(sizes[keep])
        self.owners.append(np.asarray(self.batch_owner, dtype=np.int64)[keep])
        self.stats["sentences_empty_after_tokenizing"] += int((~keep).sum())
        self.stats["unknown_tokens"] += int(np.count_nonzero(ids == self.unk_id))
        spaced = [s for s, language in zip(batch, self.batch_language) if language is None]
        self.stats["words"] += sum(s.count(" ") for s in spaced) + len(spaced) + segmented_words
        chars = sum(len(s) for s in batch) + len(batch)
        self.stats["chars"] += chars
        report_progress(chars)
        self.batch = []
        self.batch_owner = []
        self.batch_language = []

    def offsets(self) -> tuple[np.ndarray, np.ndarray]:
        """(sentence offsets, document offsets) of the kept sentences; tokenless documents are dropped."""
        sentence_lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        owner = np.concatenate(self.owners) if self.owners else np.zeros(0, np.int64)
        per_document = np.bincount(owner, minlength=self.documents)
        self.stats["documents_empty_after_tokenizing"] = int(np.count_nonzero(per_document == 0))
        sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64)
        document_offsets = np.concatenate([[0], np.cumsum(per_document[per_document > 0])]).astype(np.int64)
        return sentence_offsets, document_offsets


def tokenize_shard(documents_path: str, split_dir: str, name: str, tokenizer_dir: str, facts: dict[str, Any],
                   word_segmenter: str, record_path: str, key: str) -> dict[str, Any]:
    """Tokenize one stage-1 file into a shard (tokens, sentence and document offsets, word starts) plus a
    record; `word_segmenter` is prepare.word_segmenter (see bertrain.data.word_units)."""
    split_path = Path(split_dir)
    split_path.mkdir(parents=True, exist_ok=True)
    # One writer per shard: a second run on the same DATA_DIR (a requeued job while the first still runs, a worker
    # of a killed run) would truncate the same temporary files under the first writer and leave zeros in the shard.
    with exclusive_lock(Path(record_path).with_suffix(".lock"), wait=True):
        done = shard_record(split_path.parent, split_path.name, name, key)
        if done is not None:  # the other writer finished it meanwhile
            return {k: v for k, v in done.items() if k != "key"}
        return _write_shard(documents_path, split_path, name, tokenizer_dir, facts, word_segmenter, record_path, key)


def _write_shard(documents_path: str, split_path: Path, name: str, tokenizer_dir: str, facts: dict[str, Any],
                 word_segmenter: str, record_path: str, key: str) -> dict[str, Any]:
    """tokenize_shard's work, under its lock."""
    tokenizer = corpus_tokenizer(tokenizer_dir)
    dtype = token_dtype_for(facts["vocab_size"])
    tables = word_tables(str(Path(tokenizer_dir) / "tokenizer.json"), facts["kind"], facts["word_marker"],
                         facts["vocab_size"])
    raw_tokens = split_path / f"{name}.tokens.raw.tmp"
    raw_starts = split_path / f"{name}.word_starts.raw.tmp"
    with (open(documents_path, encoding="utf-8") as handle, open(raw_tokens, "wb") as out,
          open(raw_starts, "wb") as starts_out):
        encoder = _SentenceEncoder(tokenizer, dtype, facts["special_tokens"]["unk"], out, tables, starts_out)
        for document, sentences in enumerate(_documents(handle)):
            language = document_language("\n".join(sentences), word_segmenter)
            if language is not None:
                encoder.stats[f"documents_segmented_{language}"] += 1
            for sentence in sentences:
                encoder.add(sentence, document, language)
        encoder.flush()
    sentence_offsets, document_offsets = encoder.offsets()
    count = int(sentence_offsets[-1])
    tokens = np.memmap(raw_tokens, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    starts = np.fromfile(raw_starts, dtype=np.uint8).astype(bool)
    record = write_shard(split_path, name, tokens, sentence_offsets, document_offsets, starts)
    del tokens
    raw_tokens.unlink()
    raw_starts.unlink()
    record.update({key_: int(value) for key_, value in encoder.stats.items()})
    write_json(Path(record_path), {"key": key, **record})
    return record


def shard_record(out: Path, split: str, name: str, key: str) -> Optional[dict]:
    """A shard's record when the shard is complete for `key`, else None."""
    record = read_json(out / WORK / "shards" / f"{split}-{name}.json")
    if record is None or record.get("key") != key:
        return None
    if not all(path.is_file() for path in shard_paths(out / split, name).values()):
        return None
    return record


def pending_shards(out: Path, documents: dict[str, Any], key: str,
                   only: Optional[list[tuple[str, str]]] = None) -> list[tuple[str, dict]]:
    """(split, shard) of every shard without a complete output for `key` (among `only`, if given)."""
    return [(split, shard) for split in SPLITS for shard in documents["shards"][split]
            if (only is None or (split, shard["name"]) in only)
            and shard_record(out, split, shard["name"], key) is None]


def build_shards(out: Path, documents: dict[str, Any], facts: dict[str, Any], word_segmenter: str,
                 key: str, only: Optional[list[tuple[str, str]]], workers: Workers, console: Any) -> None:
    """Stage 3: tokenize every shard not already done (or only the listed ones), in parallel."""
    (out / WORK / "shards").mkdir(parents=True, exist_ok=True)
    todo = pending_shards(out, documents, key, only)
    if not todo:
        return
    todo.sort(key=lambda item: -item[1]["chars"])  # largest first: better packing over workers
    total = sum(shard["chars"] for _, shard in todo)
    arguments = [(str(out / WORK / "documents" / split / f"{shard['name']}.txt"), str(out / split), shard["name"],
                  str(out / "tokenizer"), facts, word_segmenter,
                  str(out / WORK / "shards" / f"{split}-{shard['name']}.json"), key) for split, shard in todo]
    with progress_bar(console) as progress:
        task = progress.add_task("tokenizing", total=total or None, docs=0, rate=0.0)
        rate = Rate()
        done_docs = 0
        if workers.count <= 1 or len(todo) == 1:
            for (_, shard), args in zip(todo, arguments):
                with local_progress(lambda n: progress.update(task, advance=n)):
                    tokenize_shard(*args)
                done_docs += shard["documents"]
                progress.update(task, docs=done_docs, rate=rate(done_docs))
            return
        workers.start()
        futures = {workers.executor.submit(tokenize_shard, *args): shard for (_, shard), args in zip(todo, arguments)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()
                done_docs += futures[future]["documents"]
            progress.update(task, advance=workers.drain(), docs=done_docs, rate=rate(done_docs))

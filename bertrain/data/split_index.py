"""A split's sentence and document offsets in one global token space, and reading tokens at global positions.

Shared by the pair plans (pairs.py, pair_chunks.py) and the loader, below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bertrain.data.format import Split
from bertrain.errors import DataError


@dataclass
class SplitIndex:
    """Offsets of all shards of a split in one global token space: shards back to back, so the
    global position of sentence i is the number of tokens before it, sentence_cum[i]."""

    sentence_cum: np.ndarray     # [S + 1] int64 tokens before each sentence (lengths' cumulative sum)
    document_first: np.ndarray   # [D + 1] int64 global sentence index where each document starts
    token_base: np.ndarray       # [K + 1] int64 global position of each shard's first token
    sentence_final: np.ndarray | None = None   # [S] bool sentence ends on . ! ? (read for NSP plans only)

    @property
    def sentence_start(self) -> np.ndarray:
        """[S] global token position of each sentence (a view, no copy)."""
        return self.sentence_cum[:-1]

    @property
    def num_documents(self) -> int:
        return len(self.document_first) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_cum) - 1


def index_split(split: Split) -> SplitIndex:
    """Read the (small) offset arrays of every shard into one global index, checking them."""
    lengths, firsts, bases = [], [np.zeros(1, np.int64)], [0]
    sentence_base = 0
    for shard in split.shards:
        offsets = np.asarray(shard.sentence_offsets, dtype=np.int64)
        documents = np.asarray(shard.document_offsets, dtype=np.int64)
        length = np.diff(offsets)
        if (len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(shard.tokens) or (length < 0).any()
                or len(documents) == 0 or documents[0] != 0 or documents[-1] != len(offsets) - 1
                or (np.diff(documents) < 0).any()):
            raise DataError(f"Shard {split.name}/{shard.name}: its sentence or document offsets are not "
                            f"increasing from 0 to the end of the shard (damaged file). Run `bertrain prepare` "
                            f"again to rebuild it.")
        lengths.append(length)
        firsts.append(documents[1:] + sentence_base)
        sentence_base += len(offsets) - 1
        bases.append(bases[-1] + len(shard.tokens))
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return SplitIndex(np.concatenate([[0], np.cumsum(length)]).astype(np.int64),
                      np.concatenate(firsts).astype(np.int64), np.asarray(bases, dtype=np.int64))


def read_values(array: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Values at positions of a per-token array (read_spans' and gather_tokens' plain read)."""
    return array[local]


def gather_tokens(shards_tokens: list[np.ndarray], token_base: np.ndarray, positions: np.ndarray,
                  read: Callable = read_values) -> np.ndarray:
    """Token ids (int64) at global token positions (any shape), read from the memory-mapped shards
    (`read(shard array, shard-local positions)` reads other per-token arrays, e.g. read_bits)."""
    flat = positions.reshape(-1)
    shard = np.searchsorted(token_base, flat, side="right") - 1
    if len(flat) == 0 or shard.min() == shard.max():
        k = int(shard[0]) if len(flat) else 0
        return np.asarray(read(shards_tokens[k], flat - token_base[k])).astype(np.int64).reshape(positions.shape)
    # Group positions by shard with a radix-friendly stable sort, then one fancy read per shard.
    shard = shard.astype(np.int16 if len(shards_tokens) < 2**15 else np.int32)
    order = np.argsort(shard, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(shard, minlength=len(shards_tokens)))])
    out = np.empty(flat.shape, dtype=np.int64)
    for k in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[k]:bounds[k + 1]]
        out[rows] = read(shards_tokens[k], flat[rows] - token_base[k])
    return out.reshape(positions.shape)


def span_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions start..start+length-1 of each span, concatenated in span order (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    before = np.cumsum(lengths) - lengths                    # output positions before each span
    return np.repeat(np.asarray(starts, dtype=np.int64) - before, lengths) + np.arange(int(lengths.sum()))


def read_spans(token_base: np.ndarray, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray,
               targets: list[tuple[list[np.ndarray], np.ndarray, Callable]]) -> np.ndarray:
    """For each target (per-shard arrays, a flat `out`, read(shard array, local positions)), write each span
    [start, start + length) of the arrays to `out` from index `at` on: gather_tokens with one shard lookup per span
    instead of a sort of every token by shard (a span lies in one document), and one lookup for all the targets (the
    token ids and the word-start bits of the same spans). Returns the indices of `out` written (in no order)."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    used = lengths > 0
    shard = np.searchsorted(token_base, starts, side="right") - 1
    if (shard != np.searchsorted(token_base, starts + lengths - 1, side="right") - 1)[used].any():
        place, positions = span_positions(at, lengths), span_positions(starts, lengths)
        for arrays, out, read in targets:
            out[place] = gather_tokens(arrays, token_base, positions, read)  # across shards
        return place
    shard = np.where(used, shard, 0)     # an empty span's start may lie past the last shard
    order = np.argsort(shard, kind="stable")                # spans grouped by shard: one fancy read per shard
    shard, lengths = shard[order], lengths[order]
    local = span_positions(starts[order] - token_base[shard], lengths)
    place = span_positions(np.asarray(at, dtype=np.int64)[order], lengths)
    first_span = np.flatnonzero(np.concatenate([[True], shard[1:] != shard[:-1]]))
    bounds = np.append(np.concatenate([[0], np.cumsum(lengths)])[first_span], len(local))
    for k, first, last in zip(shard[first_span], bounds[:-1], bounds[1:]):
        for arrays, out, read in targets:
            out[place[first:last]] = read(arrays[k], local[first:last])
    return place


def read_bits(packed: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Bits at positions of an np.packbits array (big-endian bit order)."""
    return (packed[local >> 3] >> (7 - (local & 7)).astype(np.uint8)) & 1

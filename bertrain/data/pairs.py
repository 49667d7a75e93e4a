"""NSP / SOP epoch plans: which token spans form each instance, computed per (seed, epoch).

Pairs are never written to disk. An epoch's plan is a handful of numpy arrays with one entry per
instance (token spans of segment A and B, sentence label, source documents), built vectorized from
the sentence and document offsets of every shard of a split; an instance is then assembled in O(1)
from the memory-mapped tokens (`gather_instances`). Memory is proportional to sentences + instances,
never to tokens.

The algorithm is Google's `create_instances_from_document` (BERT's create_pretraining_data.py),
vectorized *across documents*: each iteration of the loop in `build_plan` advances every document
(window) by one chunk at once, so the Python loop runs max-chunks-per-window times, not once per
chunk. Where it differs from Google's, on purpose:
  * the short target (`short_seq_prob`) is drawn per chunk; Google draws it once per document, so
    a "short" document makes all its chunks short (and the realized share of short instances is
    not `short_seq_prob`).
  * documents are chunked in windows of at most `WINDOW_SENTENCES` sentences (a chunk never
    crosses a window edge), which bounds the loop length for book-length documents; windows are
    planned in blocks of about a million sentences, which bounds the scratch memory.
  * NSP: a single-sentence chunk drawn as a positive is split inside the sentence (as SOP does);
    Google forces it to a random-document negative, which pushes the positive share below 50%.
    The random document is drawn uniformly among the *other* documents (Google retries 10 times
    and can end up with the same document). The put-back of a negative's unused sentences (the
    chunk's B part is reconsidered for the next chunk) is kept exactly as Google does.
  * SOP: a negative is the positive with A and B swapped after truncation (an exact swap); a
    single-sentence chunk is split inside the sentence and never gets a random-document B
    (ALBERT's code leaks NSP negatives into SOP there).
Label convention (transformers): 0 = positive (B follows A), 1 = negative (random B / swapped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertrain.data.format import Split
from bertrain.errors import DataError

WINDOW_SENTENCES = 1024
BLOCK_SENTENCES = 1 << 20
_SPLIT_TAGS = {"train": 0, "validation": 1}


@dataclass
class SplitIndex:
    """Offsets of all shards of a split in one global token space: shards back to back, so the
    global position of sentence i is the number of tokens before it, sentence_cum[i]."""

    sentence_cum: np.ndarray     # [S + 1] int64 tokens before each sentence (lengths' cumulative sum)
    document_first: np.ndarray   # [D + 1] int64 global sentence index where each document starts
    token_base: np.ndarray       # [K + 1] int64 global position of each shard's first token

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


@dataclass
class EpochPlan:
    """One epoch's instances (in document order) and their shuffled order."""

    a_start: np.ndarray          # [N] int64 global token position of segment A
    a_length: np.ndarray         # [N] int32
    b_start: np.ndarray          # [N] int64 (unused for objective none)
    b_length: np.ndarray         # [N] int32 (0 for objective none)
    sentence_label: np.ndarray   # [N] int8: 0 positive, 1 negative (all 0 for objective none)
    document: np.ndarray         # [N] int64 document of A
    b_document: np.ndarray       # [N] int64 document of B
    target: np.ndarray           # [N] int32 target length of the chunk (< max tokens when short_seq_prob hit)
    order: np.ndarray            # [N] int64 permutation: the epoch reads instances order[0], order[1], ...
    skipped_chunks: int          # chunks too short to form an instance (fewer than 2 tokens for a pair)

    def __len__(self) -> int:
        return len(self.order)


def epoch_generator(seed: int, epoch: int, split: str = "train") -> np.random.Generator:
    """The numpy generator of an epoch's plan: a function of (seed, epoch, split) only."""
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF,
                                                         epoch, _SPLIT_TAGS.get(split, 2), 0x5EED]))


def _randint(rng: np.random.Generator, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Uniform integers in [low, high] (inclusive, elementwise; high >= low)."""
    return low + np.floor(rng.random(len(low)) * (high - low + 1)).astype(np.int64)


def _chunk_end(index: SplitIndex, first: np.ndarray, target: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Last sentence of a chunk starting at `first`: the first sentence where the running token
    count reaches `target` (Google's `current_length >= target_seq_length`), at most `last`."""
    reach = index.sentence_cum[first] + np.maximum(target, 1)
    # Sorted queries let searchsorted reuse the previous answer: ~10x faster on random-document starts.
    order = np.argsort(reach, kind="stable")
    end = np.empty_like(reach)
    end[order] = np.searchsorted(index.sentence_cum, reach[order], side="left") - 1
    return np.clip(end, first, last)


def truncate_pair(a_length: np.ndarray, b_length: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Closed form of Google's truncate_seq_pair lengths: trim the longer segment (B on ties) one
    token at a time until the pair fits."""
    a, b = a_length.astype(np.int64), b_length.astype(np.int64)
    excess = np.maximum(a + b - max_tokens, 0)
    half_up, half_down = (max_tokens + 1) // 2, max_tokens // 2
    # Only A shrinks while A stays longer than B; only B while B stays at least as long as A;
    # otherwise both meet in the middle (A keeps the extra token of an odd budget, B loses on ties).
    only_a = a - excess > b
    only_b = ~only_a & (b - excess >= a)
    new_a = np.where(only_a, a - excess, np.where(only_b, a, half_up))
    new_b = np.where(only_a, b, np.where(only_b, b - excess, half_down))
    fits = excess == 0
    return np.where(fits, a, new_a), np.where(fits, b, new_b)


def _trim(rng: np.random.Generator, start: np.ndarray, length: np.ndarray, new_length: np.ndarray) -> np.ndarray:
    """New start after removing tokens from a random end one at a time (Google: 50/50 front or back)."""
    removed = length - new_length
    front = rng.binomial(removed, 0.5) if len(removed) else removed
    return start + front


def build_plan(index: SplitIndex, *, objective: str, max_seq_length: int, short_seq_prob: float,
               seed: int, epoch: int, split: str = "train") -> EpochPlan:
    """The instances and order of one epoch, a pure function of (data, settings, seed, epoch, split)."""
    if objective not in ("nsp", "sop", "none"):
        raise DataError(f"data.objective must be nsp, sop or none, not {objective!r}.")
    rng = epoch_generator(seed, epoch, split)
    nonempty = np.flatnonzero(np.diff(index.document_first) > 0)
    if objective == "nsp" and len(nonempty) < 2:
        raise DataError(f"The {split} split has {len(nonempty)} non-empty document(s): NSP needs at least two, "
                        f"because a negative takes its second segment from a different document. Use more "
                        f"documents, or data.objective: sop (or none).")

    # Windows: documents cut into runs of at most WINDOW_SENTENCES sentences (see module docstring).
    doc_first, doc_end = index.document_first[:-1], index.document_first[1:]
    windows_per_doc = -(-(doc_end - doc_first) // WINDOW_SENTENCES)
    window_doc = np.repeat(np.arange(index.num_documents, dtype=np.int64), windows_per_doc)
    first_window = np.cumsum(windows_per_doc) - windows_per_doc
    window_rank = np.arange(len(window_doc)) - np.repeat(first_window, windows_per_doc)
    window_first = doc_first[window_doc] + window_rank * WINDOW_SENTENCES
    window_end = np.minimum(window_first + WINDOW_SENTENCES, doc_end[window_doc])

    # Blocks of consecutive windows (about BLOCK_SENTENCES sentences each) are planned one after the
    # other with the same generator: scratch memory is per block, what is kept is per instance.
    block = (window_first - (window_first[0] if len(window_first) else 0)) // BLOCK_SENTENCES
    bounds = np.flatnonzero(np.diff(block, prepend=-1, append=block[-1] + 1 if len(block) else 0))
    pieces = [_plan_block(index, window_first[a:b], window_end[a:b], window_doc[a:b], nonempty, rng,
                          objective=objective, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob)
              for a, b in zip(bounds[:-1], bounds[1:])]
    empty = {"a_start": np.int64, "a_length": np.int32, "b_start": np.int64, "b_length": np.int32,
             "sentence_label": np.int8, "document": np.int64, "b_document": np.int64, "target": np.int32}
    fields = {name: (np.concatenate([piece[name] for piece in pieces]) if pieces else np.zeros(0, empty[name]))
              for name in empty}
    skipped = sum(piece["skipped"] for piece in pieces)
    return EpochPlan(**fields, order=rng.permutation(len(fields["a_start"])), skipped_chunks=skipped)


def _plan_block(index: SplitIndex, position: np.ndarray, window_end: np.ndarray, window_doc: np.ndarray,
                nonempty: np.ndarray, rng: np.random.Generator, *, objective: str, max_seq_length: int,
                short_seq_prob: float) -> dict:
    """Instances of one block of windows: Google's per-document loop, run for all windows at once."""
    pairs = objective != "none"
    max_tokens = max_seq_length - (3 if pairs else 2)
    position = position.copy()
    active = np.arange(len(position))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("first", "end", "split", "random", "doc", "target")}
    while len(active):
        first, last, doc = position[active], window_end[active] - 1, window_doc[active]
        count = len(active)
        short = rng.random(count) < short_seq_prob
        target = np.where(short, _randint(rng, np.full(count, 2), np.full(count, max(max_tokens, 2))), max_tokens)
        end = _chunk_end(index, first, target, last)
        n_sentences = end - first + 1
        one = np.ones(count, np.int64)
        a_sentences = np.where(n_sentences >= 2, _randint(rng, one, np.maximum(n_sentences - 1, 1)), 1)
        negative = (rng.random(count) < 0.5) if pairs else np.zeros(count, bool)
        # Google's put-back: a random-B chunk used only its A sentences; the rest start the next chunk.
        random_b = negative if objective == "nsp" else np.zeros(count, bool)
        next_position = np.where(random_b, first + a_sentences, end + 1)
        for key, value in (("first", first), ("end", end), ("split", a_sentences), ("random", negative),
                           ("doc", doc), ("target", target)):
            parts[key].append(value)
        position[active] = next_position
        active = active[next_position < window_end[active]]

    first, end, a_sentences = (np.concatenate(parts[k]) for k in ("first", "end", "split"))
    negative, document, target = (np.concatenate(parts[k]) for k in ("random", "doc", "target"))
    del parts
    count = len(first)
    cum, sentence_start = index.sentence_cum, index.sentence_start
    chunk_tokens = cum[end + 1] - cum[first]
    a_start = sentence_start[first]

    if not pairs:
        a_length = chunk_tokens
        keep = a_length >= 1
        new_a = np.minimum(a_length, max_tokens)
        a_start = _trim(rng, a_start, a_length, new_a)
        b_start, b_length, b_document = np.zeros(count, np.int64), np.zeros(count, np.int64), document
        a_length, label = new_a, np.zeros(count, np.int8)
    else:
        random_b = negative & (objective == "nsp")
        a_length = cum[first + a_sentences] - cum[first]
        b_start = sentence_start[np.minimum(first + a_sentences, end)]
        b_length = chunk_tokens - a_length
        # A chunk that cannot be split at a sentence boundary (one sentence, or an empty side) is
        # split inside at a uniform token position, unless B comes from another document anyway.
        inside = ~random_b & ((a_length == 0) | (b_length == 0))
        cut = _randint(rng, np.ones(count, np.int64), np.maximum(chunk_tokens - 1, 1))
        a_length = np.where(inside, cut, a_length)
        b_start = np.where(inside, a_start + cut, b_start)
        b_length = np.where(inside, np.maximum(chunk_tokens - cut, 0), b_length)
        b_document = document.copy()
        if objective == "nsp":
            rows = np.flatnonzero(random_b)
            # A random *other* document: draw among the other non-empty ones, skipping the chunk's own.
            own = np.searchsorted(nonempty, document[rows])
            other = np.floor(rng.random(len(rows)) * (len(nonempty) - 1)).astype(np.int64)
            other = nonempty[other + (other >= own)]
            other_first, other_end = index.document_first[other], index.document_first[other + 1]
            random_first = _randint(rng, other_first, np.maximum(other_end - 1, other_first))
            b_target = target[rows] - a_length[rows]
            random_end = _chunk_end(index, random_first, b_target, np.maximum(other_end - 1, other_first))
            b_start[rows] = sentence_start[random_first]
            b_length[rows] = cum[random_end + 1] - cum[random_first]
            b_document[rows] = other
        keep = (a_length >= 1) & (b_length >= 1)
        new_a, new_b = truncate_pair(a_length, b_length, max_tokens)
        a_start = _trim(rng, a_start, a_length, new_a)
        b_start = _trim(rng, b_start, b_length, new_b)
        a_length, b_length = new_a, new_b
        label = negative.astype(np.int8)
        if objective == "sop":  # the negative is the truncated positive with its segments swapped
            a_start, b_start = np.where(negative, b_start, a_start), np.where(negative, a_start, b_start)
            a_length, b_length = np.where(negative, b_length, a_length), np.where(negative, a_length, b_length)

    kept = np.flatnonzero(keep)
    return {"a_start": a_start[kept], "a_length": a_length[kept].astype(np.int32), "b_start": b_start[kept],
            "b_length": b_length[kept].astype(np.int32), "sentence_label": label[kept], "document": document[kept],
            "b_document": b_document[kept], "target": target[kept].astype(np.int32),
            "skipped": int(count - len(kept))}


def gather_tokens(shards_tokens: list[np.ndarray], token_base: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Token ids (int64) at global token positions (any shape), read from the memory-mapped shards."""
    flat = positions.reshape(-1)
    shard = np.searchsorted(token_base, flat, side="right") - 1
    if len(flat) == 0 or shard.min() == shard.max():
        k = int(shard[0]) if len(flat) else 0
        return shards_tokens[k][flat - token_base[k]].astype(np.int64).reshape(positions.shape)
    # Group positions by shard with a radix-friendly stable sort, then one fancy read per shard.
    shard = shard.astype(np.int16 if len(shards_tokens) < 2**15 else np.int32)
    order = np.argsort(shard, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(shard, minlength=len(shards_tokens)))])
    out = np.empty(flat.shape, dtype=np.int64)
    for k in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[k]:bounds[k + 1]]
        out[rows] = shards_tokens[k][flat[rows] - token_base[k]]
    return out.reshape(positions.shape)

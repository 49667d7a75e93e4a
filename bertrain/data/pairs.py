"""NSP / SOP epoch plans: which token spans form each instance, computed per (seed, epoch).

Pairs are never written to disk. An epoch's plan is a few numpy arrays with one entry per instance (spans of
segments A and B, sentence label, documents), built vectorized from the sentence and document offsets of a split
(split_index.py); an instance is then assembled in O(1) from the memory-mapped tokens. Memory is proportional to
sentences + instances, never to tokens.

The algorithm is Google's `create_instances_from_document` (BERT's create_pretraining_data.py), vectorized across
documents: each iteration of `pair_chunks.plan_chunks` advances every document window by one chunk. Where it
differs from Google's, on purpose:
  * the short target (`short_seq_prob`) is drawn per chunk, not per document (else the realized share of short
    instances is not `short_seq_prob`);
  * documents are chunked in windows of at most `WINDOW_SENTENCES` sentences (equal-sized, a chunk never crosses
    one), planned in blocks of about a million sentences: bounded loop length and scratch memory;
  * no surface feature reveals the label (`bertrain inspect DATA_DIR --pairs --audit` measures it,
    tests/test_pair_audit.py holds it within 2 points of chance). Google's rules leak it:
      - A and B are whole sentences (until truncation): A takes sentences up to a uniform budget of 1..target-1
        tokens, B until the pair reaches the target. Google splits a one-sentence chunk at a random token, so "B
        starts inside a word" and "A ends without . ! ?" meant positive. The sentence added to B, mostly truncated
        away, starts the next chunk, so MLM still sees it.
      - SOP: a negative swaps A and B *before* truncation (as ALBERT's code does), and truncation is symmetric in
        expectation (a coin picks which segment loses ties and keeps the odd token); windows are walked forward
        or backward (a coin each), since the sentence completing a chunk is longer than average.
      - NSP: a negative's B is made by the rule that made the positive's B it replaces, from another document:
        from a uniform sentence until the pair reaches the target, or, where the positive's B ended with its
        document short of the target, as many sentences at the end of a document, as short.
      - one-sentence windows have no second segment: they are cut at a uniform token and get sentence label -100
        (MLM only); Google makes them NSP negatives, so "A is a whole short document" gave the label away.
  * NSP: the random document is never A's own (Google retries 10 times); the put-back of a negative's unused
    sentences is kept as Google does. SOP never gets a random-document B (ALBERT's code does for one-sentence chunks).
Label convention (transformers): 0 = positive (B follows A), 1 = negative (random B / swapped), -100 = no label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertrain.data.pair_chunks import plan_chunks, random_b, uniform_int
from bertrain.data.split_index import SplitIndex
from bertrain.errors import DataError

WINDOW_SENTENCES = 1024
BLOCK_SENTENCES = 1 << 20
_SPLIT_TAGS = {"train": 0, "validation": 1}


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


def truncate_pair(a_length: np.ndarray, b_length: np.ndarray, max_tokens: int,
                  a_keeps_extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Closed form of Google's truncate_seq_pair lengths: trim the longer segment (B on ties) one
    token at a time until the pair fits. Where `a_keeps_extra` is False the roles are mirrored (A
    loses on ties, B keeps the extra token of an odd budget): a fair coin there makes it symmetric."""
    a, b = a_length.astype(np.int64), b_length.astype(np.int64)
    if a_keeps_extra is not None:
        mirrored_b, mirrored_a = truncate_pair(b, a, max_tokens)
        google_a, google_b = truncate_pair(a, b, max_tokens)
        return np.where(a_keeps_extra, google_a, mirrored_a), np.where(a_keeps_extra, google_b, mirrored_b)
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


def _windows(index: SplitIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first sentence, end sentence, document) of each window: a document cut into the fewest
    windows of at most WINDOW_SENTENCES sentences, of equal size (so none is a lone sentence)."""
    doc_first, doc_end = index.document_first[:-1], index.document_first[1:]
    size = doc_end - doc_first
    windows_per_doc = -(-size // WINDOW_SENTENCES)
    window_doc = np.repeat(np.arange(index.num_documents, dtype=np.int64), windows_per_doc)
    first_window = np.cumsum(windows_per_doc) - windows_per_doc
    rank = np.arange(len(window_doc)) - np.repeat(first_window, windows_per_doc)
    count, size, base = windows_per_doc[window_doc], size[window_doc], doc_first[window_doc]
    return base + rank * size // count, base + (rank + 1) * size // count, window_doc


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
    window_first, window_end, window_doc = _windows(index)
    # Blocks of consecutive windows (about BLOCK_SENTENCES sentences each) are planned one after the
    # other with the same generator: scratch memory is per block, what is kept is per instance.
    block = (window_first - (window_first[0] if len(window_first) else 0)) // BLOCK_SENTENCES
    bounds = np.flatnonzero(np.diff(block, prepend=-1, append=block[-1] + 1 if len(block) else 0))
    settings = dict(objective=objective, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob)
    pieces = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunks = plan_chunks(index, window_first[a:b], window_end[a:b], window_doc[a:b], rng, **settings)
        pieces.append(_instances(index, chunks, nonempty, rng, **settings))
    empty = {"a_start": np.int64, "a_length": np.int32, "b_start": np.int64, "b_length": np.int32,
             "sentence_label": np.int8, "document": np.int64, "b_document": np.int64, "target": np.int32}
    fields = {name: (np.concatenate([piece[name] for piece in pieces]) if pieces else np.zeros(0, empty[name]))
              for name in empty}
    skipped = sum(piece["skipped"] for piece in pieces)
    return EpochPlan(**fields, order=rng.permutation(len(fields["a_start"])), skipped_chunks=skipped)


def _instances(index: SplitIndex, chunks: dict, nonempty: np.ndarray, rng: np.random.Generator, *,
               objective: str, max_seq_length: int, short_seq_prob: float) -> dict:
    """Token spans and labels of the chunks of one block: split, random B, swap, truncate, trim."""
    first, b_first, end, negative, document, target = (
        chunks[k] for k in ("first", "b_first", "end", "negative", "doc", "target"))
    pairs = objective != "none"
    max_tokens = max_seq_length - (3 if pairs else 2)
    count = len(first)
    cum, sentence_start = index.sentence_cum, index.sentence_start
    chunk_tokens = cum[end + 1] - cum[first]
    a_start = sentence_start[first]
    if not pairs:
        keep = chunk_tokens >= 1
        new_a = np.minimum(chunk_tokens, max_tokens)
        a_start = _trim(rng, a_start, chunk_tokens, new_a)
        return _kept(keep, a_start, new_a, np.zeros(count, np.int64), np.zeros(count, np.int64),
                     np.zeros(count, np.int8), document, document, target)

    labelled = (b_first > first) & (b_first <= end)
    a_length = cum[b_first] - cum[first]
    b_start = sentence_start[np.minimum(b_first, end)]
    b_length = chunk_tokens - a_length
    # A lone sentence (a one-sentence window): cut at a uniform token; no sentence label, MLM only.
    cut = uniform_int(rng, np.ones(count, np.int64), np.maximum(chunk_tokens - 1, 1))
    a_length = np.where(labelled, a_length, cut)
    b_start = np.where(labelled, b_start, a_start + cut)
    b_length = np.where(labelled, b_length, np.maximum(chunk_tokens - cut, 0))
    b_document = document.copy()
    negative = negative & labelled
    if objective == "nsp":
        rows = np.flatnonzero(negative)
        # A positive's B short of the target ended with its window: the negative's B ends a document too.
        tail = np.where(chunk_tokens[rows] < target[rows], end[rows] - b_first[rows] + 1, 0)
        random_first, random_end, other = random_b(index, nonempty, rng, document[rows],
                                                    target[rows] - a_length[rows], tail)
        b_start[rows] = sentence_start[random_first]
        b_length[rows] = cum[random_end + 1] - cum[random_first]
        b_document[rows] = other
    else:  # SOP: the negative swaps the whole segments, before truncation
        a_start, b_start = np.where(negative, b_start, a_start), np.where(negative, a_start, b_start)
        a_length, b_length = np.where(negative, b_length, a_length), np.where(negative, a_length, b_length)
    keep = (a_length >= 1) & (b_length >= 1)
    new_a, new_b = truncate_pair(a_length, b_length, max_tokens, a_keeps_extra=rng.random(count) < 0.5)
    a_start = _trim(rng, a_start, a_length, new_a)
    b_start = _trim(rng, b_start, b_length, new_b)
    label = np.where(labelled, negative, -100).astype(np.int8)
    return _kept(keep, a_start, new_a, b_start, new_b, label, document, b_document, target)


def _kept(keep: np.ndarray, a_start, a_length, b_start, b_length, label, document, b_document, target) -> dict:
    """The plan fields of the instances to keep, in their stored dtypes."""
    kept = np.flatnonzero(keep)
    return {"a_start": a_start[kept], "a_length": a_length[kept].astype(np.int32), "b_start": b_start[kept],
            "b_length": b_length[kept].astype(np.int32), "sentence_label": label[kept], "document": document[kept],
            "b_document": b_document[kept], "target": target[kept].astype(np.int32),
            "skipped": int(len(keep) - len(kept))}

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
  * every token of the split is in an instance of every epoch (Google's trimming lost 9-26% per epoch on CPython's
    docs): a sentence longer than an instance is cut into near-equal pieces, each an instance alone (no sentence
    label); a chunk never takes a sentence that does not fit, and only two whole sentences that do not fit together
    are truncated, the one away from the cursor (which the next chunk reads again, or the last one had);
  * no surface feature reveals the label (`bertrain inspect DATA_DIR --pairs --audit` measures it,
    tests/test_pair_audit.py holds it within 2 points of chance). Google's rules leak it:
      - A and B are whole sentences: the chunk is chosen first (at least two sentences), then A takes its
        sentences up to a budget uniform over the chunk less its last sentence, B the rest. Google splits a
        one-sentence chunk at a random token, so "B starts inside a word" and "A ends without . ! ?" meant positive.
      - SOP: a negative swaps A and B *before* truncation (as ALBERT's code does); windows are walked forward or
        backward (a coin each), so the segment that is the budget's, or loses the excess, is A or B alike.
      - NSP: a negative's B is made by the rule that made the positive's B it replaces, from another document
        (`pair_chunks.random_b`): the rest of a chunk from a uniform sentence, at the end of a document where the
        positive's ended with its document, one sentence too long to fit where the positive's did not fit, ending
        on . ! ? where the positive's did (adjacent sentences end alike, e.g. "for example:" then code; Google's
        truncation hid that, whole sentences show it: +2.8 points on the demo's text at seq 128 without this);
        where no such B turns up (~1 in 1,000 instances at seq 128, 3 at 512), the positive's B stays, with no
        sentence label, and so does a positive for which the same search finds none (else that A's kind had
        positives only).
      - one-sentence windows have no second segment: they are cut at a uniform token and get sentence label -100
        (MLM only); Google makes them NSP negatives, so "A is a whole short document" gave the label away.
  * NSP: the random document is never A's own (Google retries 10 times); the put-back of a negative's unused
    sentences is kept as Google does. SOP never gets a random-document B (ALBERT's code does for one-sentence chunks).
Label convention (transformers): 0 = positive (B follows A), 1 = negative (random B / swapped), -100 = no label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertrain.data.pair_chunks import plan_chunks, random_b, split_long_sentences, uniform_int
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

    def __len__(self) -> int:
        return len(self.order)

    def covered_tokens(self, instances: np.ndarray | slice = slice(None)) -> int:
        """Distinct token positions in the segments of the instances (all, or those given)."""
        start = np.concatenate([self.a_start[instances], self.b_start[instances]])
        end = start + np.concatenate([self.a_length[instances], self.b_length[instances]])
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        reached = np.maximum.accumulate(np.concatenate([[0], end]))[:-1]  # the furthest end of the spans before
        return int(np.maximum(end - np.maximum(start, reached), 0).sum())


def epoch_generator(seed: int, epoch: int, split: str = "train") -> np.random.Generator:
    """The numpy generator of an epoch's plan: a function of (seed, epoch, split) only."""
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF,
                                                         epoch, _SPLIT_TAGS.get(split, 2), 0x5EED]))


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
    index, planned = split_long_sentences(index, max_seq_length - (3 if objective != "none" else 2), rng,
                                          alone=objective != "none")
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
        chunks = plan_chunks(planned, window_first[a:b], window_end[a:b], window_doc[a:b], rng, **settings)
        pieces.append(_instances(index, planned, chunks, nonempty, rng, **settings))
    empty = {"a_start": np.int64, "a_length": np.int32, "b_start": np.int64, "b_length": np.int32,
             "sentence_label": np.int8, "document": np.int64, "b_document": np.int64, "target": np.int32}
    fields = {name: (np.concatenate([piece[name] for piece in pieces]) if pieces else np.zeros(0, empty[name]))
              for name in empty}
    return EpochPlan(**fields, order=rng.permutation(len(fields["a_start"])))


def _instances(index: SplitIndex, planned: SplitIndex, chunks: dict, nonempty: np.ndarray,
               rng: np.random.Generator, *, objective: str, max_seq_length: int, short_seq_prob: float) -> dict:
    """Token spans and labels of the chunks of one block: split, random B, swap, truncate, trim."""
    first, b_first, end, negative, document, target, last, cut_first = (
        chunks[k] for k in ("first", "b_first", "end", "negative", "doc", "target", "last", "cut_first"))
    pairs = objective != "none"
    max_tokens = max_seq_length - (3 if pairs else 2)
    count = len(first)
    cum, sentence_start = index.sentence_cum, index.sentence_start
    chunk_tokens = cum[end + 1] - cum[first]
    a_start = sentence_start[first]
    if not pairs:  # chunks fit: nothing to truncate
        return _kept(chunk_tokens >= 1, a_start, chunk_tokens, np.zeros(count, np.int64), np.zeros(count, np.int64),
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
        # Positives get the same search for a negative's B (its result unused): an instance is labelled only where
        # one exists, so that having a label says nothing of which (a group of As with none was all positives).
        rows = np.flatnonzero(labelled)
        # A positive's B short of the target ended with its window: the negative's B ends a document too.
        room = max_tokens - a_length[rows]
        tail = np.where((chunk_tokens[rows] < target[rows]) & (end[rows] == last[rows]),
                        end[rows] - b_first[rows] + 1, 0)
        # Adjacent text ends alike (a colon, then code): the negative's B ends on . ! ? where the positive's did.
        b_final = None if planned.sentence_final is None else planned.sentence_final[end[rows]]
        random_first, random_end, other = random_b(planned, nonempty, rng, document[rows],
                                                    np.where(b_length[rows] > room, b_length[rows],
                                                             target[rows] - a_length[rows]), tail, room, max_tokens,
                                                    b_final)
        found = other >= 0
        replace = found & negative[rows]
        labelled[rows[~found]] = negative[rows[~found]] = False   # no B by the rules (~1 in 1,000): MLM only
        rows, random_first, random_end = rows[replace], random_first[replace], random_end[replace]
        b_start[rows] = sentence_start[random_first]
        b_length[rows] = cum[random_end + 1] - cum[random_first]
        b_document[rows] = other[replace]
    else:  # SOP: the negative swaps the whole segments, before truncation
        a_start, b_start = np.where(negative, b_start, a_start), np.where(negative, a_start, b_start)
        a_length, b_length = np.where(negative, b_length, a_length), np.where(negative, a_length, b_length)
    keep = (a_length >= 1) & (b_length >= 1)
    # Two sentences that do not fit together: the one away from the cursor loses what does not fit (the
    # next chunk starts with it, or the last one had it), from both ends at random. SOP: before the swap.
    excess = np.maximum(a_length + b_length - max_tokens, 0)
    cut_a = np.where(cut_first != (negative & (objective == "sop")), np.minimum(excess, a_length - 1),
                     excess - np.minimum(excess, b_length - 1))
    new_a, new_b = a_length - cut_a, b_length - (excess - cut_a)
    a_start = _trim(rng, a_start, a_length, new_a)
    b_start = _trim(rng, b_start, b_length, new_b)
    label = np.where(labelled, negative, -100).astype(np.int8)
    return _kept(keep, a_start, new_a, b_start, new_b, label, document, b_document, target)


def _kept(keep: np.ndarray, a_start, a_length, b_start, b_length, label, document, b_document, target) -> dict:
    """The plan fields of the instances to keep, in their stored dtypes."""
    kept = np.flatnonzero(keep)
    return {"a_start": a_start[kept], "a_length": a_length[kept].astype(np.int32), "b_start": b_start[kept],
            "b_length": b_length[kept].astype(np.int32), "sentence_label": label[kept], "document": document[kept],
            "b_document": b_document[kept], "target": target[kept].astype(np.int32)}

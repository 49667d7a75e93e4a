"""Chunks of an NSP / SOP epoch plan: runs of sentences walked through document windows, where B
starts in each, and the random B of NSP negatives (see bertrain.data.pairs for the rules and why)."""

from __future__ import annotations

import numpy as np

from bertrain.data.split_index import SplitIndex

RANDOM_B_DRAWS = 10


def uniform_int(rng: np.random.Generator, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Uniform integers in [low, high] (inclusive, elementwise; high >= low)."""
    return low + np.floor(rng.random(len(low)) * (high - low + 1)).astype(np.int64)


def _sentence_at(index: SplitIndex, reach: np.ndarray, side: str) -> np.ndarray:
    """The sentence holding global token count `reach` (np.searchsorted's `side` at a boundary)."""
    # Sorted queries let searchsorted reuse the previous answer: ~10x faster on random-document starts.
    order = np.argsort(reach, kind="stable")
    sentence = np.empty_like(reach)
    sentence[order] = np.searchsorted(index.sentence_cum, reach[order], side=side) - 1
    return sentence


def _chunk_end(index: SplitIndex, first: np.ndarray, target: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Last sentence of a chunk starting at `first`: the first sentence where the running token
    count reaches `target` (Google's `current_length >= target_seq_length`), at most `last`."""
    return np.clip(_sentence_at(index, index.sentence_cum[first] + np.maximum(target, 1), "left"), first, last)


def _chunk_start(index: SplitIndex, end: np.ndarray, target: np.ndarray, first: np.ndarray) -> np.ndarray:
    """First sentence of a chunk built backward from `end`: the mirror of `_chunk_end`, at least `first`."""
    return np.clip(_sentence_at(index, index.sentence_cum[end + 1] - np.maximum(target, 1), "right"), first, end)


def _other_document(nonempty: np.ndarray, rng: np.random.Generator, document: np.ndarray) -> np.ndarray:
    """A uniform non-empty document other than `document` (elementwise)."""
    own = np.searchsorted(nonempty, document)
    other = np.floor(rng.random(len(document)) * (len(nonempty) - 1)).astype(np.int64)
    return nonempty[other + (other >= own)]


def _walk_forward(index: SplitIndex, rng: np.random.Generator, start: np.ndarray, target: np.ndarray,
                  budget: np.ndarray, low: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, ...]:
    """(first, b_first, end) of chunks walked forward from `start`: A takes sentences until `budget`
    tokens, then B until the pair has `target` (B is one sentence when A has reached it already).
    When the window ends inside A, the chunk's sentences are split at a uniform sentence boundary;
    a lone last sentence is paired with the one before it; a lone sentence in its window has no B
    (b_first == first)."""
    cum = index.sentence_cum
    a_end = _chunk_end(index, start, budget, last)
    has_b = a_end < last
    need = target - (cum[a_end + 1] - cum[start])
    end = np.where(has_b, _chunk_end(index, np.minimum(a_end + 1, last), need, last), a_end)
    count = end - start + 1
    resplit = start + uniform_int(rng, np.ones(len(start), np.int64), np.maximum(count - 1, 1))
    b_first = np.where(has_b, a_end + 1, np.where(count >= 2, resplit, start))
    pair_back = (count == 1) & (start > low)
    return start - pair_back, np.where(pair_back, start, b_first), end


def _walk_backward(index: SplitIndex, rng: np.random.Generator, stop: np.ndarray, target: np.ndarray,
                   budget: np.ndarray, low: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, ...]:
    """The mirror of `_walk_forward`: B takes sentences backward from `stop` until `budget` tokens,
    then A until the pair has `target`."""
    cum = index.sentence_cum
    b_first = _chunk_start(index, stop, budget, low)
    has_a = b_first > low
    need = target - (cum[stop + 1] - cum[b_first])
    first = np.where(has_a, _chunk_start(index, np.maximum(b_first - 1, low), need, low), b_first)
    count = stop - first + 1
    resplit = first + uniform_int(rng, np.ones(len(stop), np.int64), np.maximum(count - 1, 1))
    b_first = np.where(has_a, b_first, np.where(count >= 2, resplit, first))
    pair_next = (count == 1) & (stop < last)
    return first, np.where(pair_next, stop + 1, b_first), stop + pair_next


def plan_chunks(index: SplitIndex, window_first: np.ndarray, window_end: np.ndarray, window_doc: np.ndarray,
                 rng: np.random.Generator, *, objective: str, max_seq_length: int, short_seq_prob: float) -> dict:
    """Chunks (sentence runs) of one block of windows and where B starts in each: Google's
    per-document loop, run for all windows at once. SOP windows are walked forward or backward (a
    coin per window); objective none takes whole chunks (b_first = end + 1)."""
    pairs = objective != "none"
    max_tokens = max_seq_length - (3 if pairs else 2)
    forward = rng.random(len(window_first)) < 0.5 if objective == "sop" else np.ones(len(window_first), bool)
    cursor = np.where(forward, window_first, window_end - 1)
    active = np.arange(len(window_first))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("first", "b_first", "end", "negative", "doc", "target")}
    while len(active):
        low, last, ahead, at = window_first[active], window_end[active] - 1, forward[active], cursor[active]
        count = len(active)
        short = rng.random(count) < short_seq_prob
        target = np.where(short, uniform_int(rng, np.full(count, 2), np.full(count, max(max_tokens, 2))), max_tokens)
        if pairs:
            budget = uniform_int(rng, np.ones(count, np.int64), np.maximum(target - 1, 1))
            first, b_first, end = at.copy(), at.copy(), at.copy()
            for rows, walk in ((ahead, _walk_forward), (~ahead, _walk_backward)):
                if rows.any():
                    first[rows], b_first[rows], end[rows] = walk(index, rng, at[rows], target[rows], budget[rows],
                                                                 low[rows], last[rows])
        else:
            first, end = at, _chunk_end(index, at, target, last)
            b_first = end + 1
        negative = (rng.random(count) < 0.5) if pairs else np.zeros(count, bool)
        # Google's put-back: a random-B chunk used only its A sentences; B's start the next chunk
        # (unless B starts at the cursor: a lone last sentence paired with the one before it). A
        # sentence added only because the other segment filled the target alone (most of it is
        # truncated away) also starts the next chunk, so that MLM sees it.
        cum = index.sentence_cum
        reuse = pairs & np.where(ahead, (cum[b_first] - cum[first] >= target) & (b_first > at),
                                 (cum[end + 1] - cum[b_first] >= target) & (b_first - 1 < at))
        put_back = negative & (b_first > at) & (b_first <= end) if objective == "nsp" else np.zeros(count, bool)
        next_cursor = np.where(ahead, np.where(put_back | reuse, b_first, end + 1),
                               np.where(reuse, b_first - 1, first - 1))
        for key, value in (("first", first), ("b_first", b_first), ("end", end), ("negative", negative),
                           ("doc", window_doc[active]), ("target", target)):
            parts[key].append(value)
        cursor[active] = next_cursor
        active = active[np.where(ahead, next_cursor <= last, next_cursor >= low)]
    return {key: np.concatenate(value) if value else np.zeros(0, np.int64) for key, value in parts.items()}


def random_b(index: SplitIndex, nonempty: np.ndarray, rng: np.random.Generator, document: np.ndarray,
              b_target: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first sentence, end sentence, document) of NSP negatives' B, from another document and made
    by the rule that made the positive's B, so that only the text tells them apart:
      * tail[i] == 0 (the positive's B reached the target): sentences from a uniform sentence of the
        split until `b_target` tokens (starting earlier where the document ends before that);
      * tail[i] == m > 0 (the positive's B ended with its window, short of the target): the last m
        sentences of a uniform document with more than m sentences and fewer than `b_target` tokens
        in them.
    Up to RANDOM_B_DRAWS draws look for such a document; then any other document will do."""
    cum, document_first = index.sentence_cum, index.document_first
    need = np.maximum(b_target, 1)
    other, first = np.full(len(document), -1, np.int64), np.zeros(len(document), np.int64)
    todo = np.arange(len(document))
    for _ in range(RANDOM_B_DRAWS if index.num_sentences else 0):
        if not len(todo):
            break
        at_end = tail[todo] > 0
        sentence = np.floor(rng.random(len(todo)) * index.num_sentences).astype(np.int64)
        drawn = np.where(at_end, _other_document(nonempty, rng, document[todo]),
                         np.searchsorted(document_first, sentence, side="right") - 1)
        drawn_end = document_first[drawn + 1]
        tail_first = drawn_end - tail[todo]
        tail_tokens = cum[drawn_end] - cum[np.maximum(tail_first, document_first[drawn])]
        fits = (drawn != document[todo]) & np.where(
            at_end, (tail_first > document_first[drawn]) & (tail_tokens < need[todo]),
            cum[drawn_end] - cum[document_first[drawn]] >= need[todo])
        other[todo[fits]] = drawn[fits]
        first[todo[fits]] = np.where(at_end, tail_first, sentence)[fits]
        todo = todo[~fits]
    other[todo] = _other_document(nonempty, rng, document[todo])
    first[todo] = uniform_int(rng, document_first[other[todo]], document_first[other[todo] + 1] - 1)
    other_first, other_last = document_first[other], document_first[other + 1] - 1
    latest = np.searchsorted(cum, cum[other_last + 1] - need, side="right") - 1
    first = np.where(tail > 0, first, np.minimum(first, np.maximum(latest, other_first)))
    end = np.where(tail > 0, other_last, _chunk_end(index, first, b_target, other_last))
    return first, end, other

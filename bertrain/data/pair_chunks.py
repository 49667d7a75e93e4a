"""Chunks of an NSP / SOP epoch plan: runs of sentences walked through document windows, where B
starts in each, and the random B of NSP negatives (see bertrain.data.pairs for the rules and why)."""

from __future__ import annotations

import dataclasses

import numpy as np

from bertrain.data.split_index import SplitIndex

RANDOM_B_DRAWS = 1000  # at 100, 1% of negatives found no B by the rules (docstrings, pydoc); at 1000, 0.1%


def uniform_int(rng: np.random.Generator, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Uniform integers in [low, high] (inclusive, elementwise; high >= low)."""
    return low + np.floor(rng.random(len(low)) * (high - low + 1)).astype(np.int64)


def split_long_sentences(index: SplitIndex, max_tokens: int, rng: np.random.Generator,
                         alone: bool) -> tuple[SplitIndex, SplitIndex]:
    """(the index with every sentence longer than `max_tokens` cut into the fewest pieces, of lengths
    differing by at most one token at random; the index to plan with), the shards on disk unchanged.
    Where `alone`, pieces count as 2 * max_tokens + 1 tokens in the second, so each is a chunk alone."""
    length = np.diff(index.sentence_cum)
    long = np.flatnonzero(length > max_tokens)
    if not len(long):
        return index, index
    pieces = -(-length[long] // max_tokens)
    offset = np.floor(rng.random(len(long)) * pieces).astype(np.int64)   # where the longer pieces go
    owner = np.repeat(np.arange(len(long)), pieces)
    rank = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)   # piece number in its sentence
    cuts = index.sentence_cum[long[owner]] + (rank * length[long[owner]] + offset[owner]) // pieces[owner]
    cum = np.insert(index.sentence_cum, long[owner][rank > 0] + 1, cuts[rank > 0])
    added = np.concatenate([[0], np.cumsum(pieces - 1)])
    final = index.sentence_final   # pieces never end a labelled B: any value will do
    cut = dataclasses.replace(index, sentence_cum=cum,
                              document_first=index.document_first + added[np.searchsorted(long, index.document_first)],
                              sentence_final=None if final is None else np.insert(final, long[owner][rank > 0] + 1, 0))
    if not alone:
        return cut, cut
    planned = np.diff(cum)
    planned[long[owner] + added[owner] + rank] = 2 * max_tokens + 1
    return cut, dataclasses.replace(cut, sentence_cum=np.concatenate([[0], np.cumsum(planned)]))


def _search(sorted_values: np.ndarray, queries: np.ndarray, side: str) -> np.ndarray:
    """np.searchsorted of the queries sorted first, each search starting from the last answer: ~10x faster."""
    order = np.argsort(queries, kind="stable")
    found = np.empty(len(queries), np.int64)
    found[order] = np.searchsorted(sorted_values, queries[order], side=side)
    return found


def _fit_end(index: SplitIndex, first: np.ndarray, max_tokens: int | np.ndarray) -> np.ndarray:
    """Last sentence of the longest run from `first` that fits in `max_tokens` (first - 1 when none)."""
    return _search(index.sentence_cum, index.sentence_cum[first] + max_tokens, "right") - 2


def _fit_start(index: SplitIndex, end: np.ndarray, max_tokens: int) -> np.ndarray:
    """First sentence of the longest run ending at `end` that fits in `max_tokens` (end + 1 when none)."""
    return _search(index.sentence_cum, index.sentence_cum[end + 1] - max_tokens, "left")


def _chunk_end(index: SplitIndex, first: np.ndarray, target: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Last sentence of a chunk starting at `first`: the first sentence where the running token
    count reaches `target` (Google's `current_length >= target_seq_length`), at most `last`."""
    reach = index.sentence_cum[first] + np.maximum(target, 1)
    return np.clip(_search(index.sentence_cum, reach, "left") - 1, first, last)


def _chunk_start(index: SplitIndex, end: np.ndarray, target: np.ndarray, first: np.ndarray) -> np.ndarray:
    """First sentence of a chunk built backward from `end`: the mirror of `_chunk_end`, at least `first`."""
    reach = index.sentence_cum[end + 1] - np.maximum(target, 1)
    return np.clip(_search(index.sentence_cum, reach, "right") - 1, first, end)


def _other_document(nonempty: np.ndarray, rng: np.random.Generator, document: np.ndarray) -> np.ndarray:
    """A uniform non-empty document other than `document` (elementwise)."""
    own = np.searchsorted(nonempty, document)
    other = np.floor(rng.random(len(document)) * (len(nonempty) - 1)).astype(np.int64)
    return nonempty[other + (other >= own)]


def _walk_forward(index: SplitIndex, rng: np.random.Generator, start: np.ndarray, target: np.ndarray,
                  low: np.ndarray, last: np.ndarray, max_tokens: int) -> tuple[np.ndarray, ...]:
    """(first, b_first, end) of chunks walked forward from `start`: sentences until `target` tokens
    (at least two), none past what fits in `max_tokens` unless two do not fit together (a truncated
    pair); A takes them until a budget uniform over the chunk less its last sentence, B the rest. A
    lone last sentence is paired with the one before it; a piece (planned as 2 * max_tokens + 1
    tokens) has no B (b_first == first)."""
    cum = index.sentence_cum
    pair = (start < last) & (cum[np.minimum(start + 2, len(cum) - 1)] - cum[start] <= 2 * max_tokens)
    cap = np.clip(_fit_end(index, start, max_tokens), start + pair, last)
    end = _chunk_end(index, np.minimum(start + 1, cap), target - (cum[start + 1] - cum[start]), cap)
    budget = uniform_int(rng, np.ones(len(start), np.int64), np.maximum(cum[end] - cum[start], 1))
    a_end = _chunk_end(index, start, budget, np.maximum(end - 1, start))
    b_first = np.where(end > start, a_end + 1, start)
    pair_back = (end == start) & (start == last) & (start > low) & (cum[start + 1] - cum[start - 1] <= 2 * max_tokens)
    return start - pair_back, np.where(pair_back, start, b_first), end


def _walk_backward(index: SplitIndex, rng: np.random.Generator, stop: np.ndarray, target: np.ndarray,
                   low: np.ndarray, last: np.ndarray, max_tokens: int) -> tuple[np.ndarray, ...]:
    """The mirror of `_walk_forward`: the chunk is taken backward from `stop`, B takes its sentences
    backward until the budget, A the rest."""
    cum = index.sentence_cum
    pair = (stop > low) & (cum[stop + 1] - cum[np.maximum(stop - 1, 0)] <= 2 * max_tokens)
    cap = np.clip(_fit_start(index, stop, max_tokens), low, stop - pair)
    first = _chunk_start(index, np.maximum(stop - 1, cap), target - (cum[stop + 1] - cum[stop]), cap)
    budget = uniform_int(rng, np.ones(len(stop), np.int64), np.maximum(cum[stop + 1] - cum[first + 1], 1))
    b_first = np.where(first < stop, _chunk_start(index, stop, budget, np.minimum(first + 1, stop)), first)
    pair_next = (first == stop) & (stop == low) & (stop < last) & (
        cum[np.minimum(stop + 2, len(cum) - 1)] - cum[stop] <= 2 * max_tokens)
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
    floor = window_first.copy()
    active = np.arange(len(window_first))
    keys = ("first", "b_first", "end", "negative", "doc", "target", "last", "cut_first")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    while len(active):
        low, last, ahead, at = floor[active], window_end[active] - 1, forward[active], cursor[active]
        count = len(active)
        short = rng.random(count) < short_seq_prob
        target = np.where(short, uniform_int(rng, np.full(count, 2), np.full(count, max(max_tokens, 2))), max_tokens)
        if pairs:
            first, b_first, end = at.copy(), at.copy(), at.copy()
            for rows, walk in ((ahead, _walk_forward), (~ahead, _walk_backward)):
                if rows.any():
                    first[rows], b_first[rows], end[rows] = walk(index, rng, at[rows], target[rows], low[rows],
                                                                 last[rows], max_tokens)
        else:
            first, end = at, _chunk_end(index, at, target, np.clip(_fit_end(index, at, max_tokens), at, last))
            b_first = end + 1
        negative = (rng.random(count) < 0.5) if pairs else np.zeros(count, bool)
        # Google's put-back: a random-B chunk used only its A sentences; B's start the next chunk (a
        # lone last sentence paired with the one before it comes back alone: the floor moves up to it).
        put_back = negative & (b_first > first) & (b_first <= end) if objective == "nsp" else np.zeros(count, bool)
        # A truncated pair's walked-last sentence also starts the next chunk, so that MLM sees what was cut.
        over = index.sentence_cum[end + 1] - index.sentence_cum[first] > max_tokens
        next_cursor = np.where(ahead, np.where(put_back, b_first, end + 1 - (over & (end > at))),
                               first - 1 + (over & (first < at)))
        floor[active] = np.where(put_back & (b_first == at), at, low)
        for key, value in (("first", first), ("b_first", b_first), ("end", end), ("negative", negative),
                           ("doc", window_doc[active]), ("target", target), ("last", last),
                           ("cut_first", at >= b_first)):
            parts[key].append(value)
        cursor[active] = next_cursor
        active = active[np.where(ahead, next_cursor <= last, next_cursor >= low)]
    return {key: np.concatenate(value) if value else np.zeros(0, np.int64) for key, value in parts.items()}


def _b_end(index: SplitIndex, first: np.ndarray, b_target: np.ndarray, room: np.ndarray,
           last: np.ndarray) -> np.ndarray:
    """End sentence of a B from `first`: until `b_target` tokens, never past what fits in `room`; one
    sentence where `b_target` > `room` (the positive's B did not fit: a truncated pair)."""
    cap = np.clip(_fit_end(index, first, room), first, last)
    return np.where(b_target > room, first, _chunk_end(index, first, b_target, cap))


def random_b(index: SplitIndex, nonempty: np.ndarray, rng: np.random.Generator, document: np.ndarray,
              b_target: np.ndarray, tail: np.ndarray, room: np.ndarray, max_tokens: int,
              b_final: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first sentence, end sentence, document) of NSP negatives' B, from another document and made
    by the rule that made the positive's B, so that only the text tells them apart:
      * tail[i] == 0: from a uniform sentence that fits in `room`, until `b_target` tokens or what fits
        (starting earlier where the document ends before that), kept with the chance a / (a + B less
        its last sentence) that the budget would have put A's end (a tokens) there;
      * tail[i] == m > 0 (the positive's B ended with its window, short of the target): the last m
        sentences of a uniform document with more than m sentences and fewer than `b_target` tokens;
      * b_target[i] > room[i] (the positive's B did not fit: a truncated pair): one sentence longer
        than `room`;
      * where `b_final` is given (NSP plans read index.sentence_final), the last sentence ends on . ! ?
        where b_final says the positive's did: else A's and B's endings agree more often in positives.
    Up to RANDOM_B_DRAWS draws look for such a B; where none is found the document is -1 (the caller keeps the
    positive's B, unlabelled: any other B would start or end inside a sentence, the cue these rules remove)."""
    cum, document_first = index.sentence_cum, index.document_first
    need = np.maximum(b_target, 1)
    other, first = np.full(len(document), -1, np.int64), np.zeros(len(document), np.int64)
    todo = np.arange(len(document))
    for _ in range(RANDOM_B_DRAWS if index.num_sentences else 0):
        if not len(todo):
            break
        at_end, over, rest = tail[todo] > 0, b_target[todo] > room[todo], room[todo]
        sentence = np.floor(rng.random(len(todo)) * index.num_sentences).astype(np.int64)
        drawn = np.where(at_end, _other_document(nonempty, rng, document[todo]),
                         _search(document_first, sentence, "right") - 1)
        drawn_first, drawn_end = document_first[drawn], document_first[drawn + 1]
        tail_first = drawn_end - tail[todo]
        start = np.where(at_end, np.maximum(tail_first, drawn_first), sentence)
        early = np.flatnonzero(~at_end & ~over & (cum[drawn_end] - cum[sentence] < need[todo]))
        latest = _search(cum, cum[drawn_end[early]] - need[todo[early]], "right") - 1
        start[early] = np.maximum(latest, drawn_first[early])      # the document ends before need: start earlier
        length = cum[start + 1] - cum[start]
        ok = (drawn != document[todo]) & np.where(over, (length > rest) & (length <= max_tokens), length <= rest)
        ok &= np.where(at_end, (tail_first > drawn_first) & (cum[drawn_end] - cum[start] < need[todo]),
                       over | (cum[drawn_end] - cum[drawn_first] >= need[todo]))
        maybe = np.flatnonzero(ok & ~over)
        end = np.where(at_end[maybe], drawn_end[maybe] - 1, _b_end(index, start[maybe], b_target[todo[maybe]],
                                                                   rest[maybe], drawn_end[maybe] - 1))
        a = max_tokens - rest[maybe]
        ok[maybe] = rng.random(len(maybe)) * (a + cum[end] - cum[start[maybe]]) < a
        if b_final is not None:
            ok[maybe] &= index.sentence_final[end] == b_final[todo[maybe]]
        other[todo[ok]] = drawn[ok]
        first[todo[ok]] = start[ok]
        todo = todo[~ok]
    drawn = np.where(other >= 0, other, document)   # the rows without a B get a valid one, unused
    first[todo] = document_first[drawn[todo]]
    other_first, other_last = document_first[drawn], document_first[drawn + 1] - 1
    latest = np.searchsorted(cum, cum[other_last + 1] - need, side="right") - 1
    first = np.where((tail > 0) | (b_target > room), first, np.minimum(first, np.maximum(latest, other_first)))
    return first, np.where(tail > 0, other_last, _b_end(index, first, b_target, room, other_last)), other

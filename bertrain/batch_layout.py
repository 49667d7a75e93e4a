"""The host's index plan of a micro-batch (masked positions, targets, counts, packing), built by the collator so
the step reads no mask back from the device. Numpy in, CPU tensors out; torch loads on first use."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100  # the label no loss counts: an unmasked position, an instance without a sentence label
MAX_BUCKETS = 4      # more length buckets: less padded attention, more kernel calls per layer


def map_tensors(value, fn, leaf: type | None = None):
    """`value` with `fn` applied to every tensor in it (through dataclasses, dicts, lists, tuples), in a fixed order;
    e.g. to(). leaf: apply it to the instances of this type instead."""
    import torch  # loaded already wherever there are tensors

    return _map(value, fn, leaf or torch.Tensor)


_PLAIN = (int, float, str, np.ndarray)   # a batch's host values: nothing to map inside them


def _map(value, fn, leaf: type):
    if isinstance(value, leaf):
        return fn(value)
    if value is None or isinstance(value, _PLAIN):  # most of a batch's leaves: skip the dataclass test
        return value
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _map(getattr(value, f.name), fn, leaf)
                                             for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return {key: _map(item, fn, leaf) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, fn, leaf) for item in value)
    return value


@dataclass
class Bucket:
    """Packed rows start..start+size-1 (longest first) viewed as [b, width] slots. Equal lengths: no copy, no mask;
    else `gather` pads by repeating a sequence's last row, `key_mask` hides those keys, `inside` picks real slots."""

    start: int
    size: int
    shape: tuple[int, int]
    gather: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    inside: torch.Tensor | None = None


@dataclass
class Packing:
    """Where a right-padded batch's real tokens sit in the packed rows (longest first), and the attention plan."""

    token_index: torch.Tensor  # [N] flat index b*T + t of each packed row
    positions: torch.Tensor    # [N] position t of each packed row in its sequence
    first_rows: torch.Tensor   # [B] packed row of each sequence's first token ([CLS]), in batch order
    lengths: np.ndarray        # [B] real tokens of each sequence, in batch order (host: buckets_of plans from it)
    width: int                 # T
    sequence_starts: torch.Tensor  # [B+1] int32 packed row where each sequence starts, then N
    longest: int               # the longest sequence (the variable-length attention kernel's bound)
    # Built on first use (buckets_of): a GPU's variable-length flash kernel never reads them, and building them
    # in the collator, then pinning and copying them, cost the host ~1 ms a 256-row micro-batch for nothing.
    buckets: list[Bucket] | None = None


@dataclass
class BatchLayout:
    """Counts (Python ints) and index tensors of one [B, T] micro-batch with MLM labels."""

    batch_size: int
    width: int             # T
    predicted: int         # N: positions with a label
    real_tokens: int       # attention_mask.sum()
    labelled: int          # instances with a sentence label (0 without sentence labels)
    max_needed: int        # K: most [CLS] + predicted positions in one row (the pruned last layer's width)
    mlm_index: torch.Tensor          # [N] flat b*T + t of the predicted positions, row-major
    targets: torch.Tensor            # [N] their labels
    needed_rows: torch.Tensor        # [B, K] [CLS] then the predicted positions ascending, padded
    mlm_index_in_rows: torch.Tensor  # [N] flat b*K + k of the predicted positions among needed_rows
    packing: Packing | None = None   # None when the rows are not right-padded or labels sit on padding
    predicted_rows: torch.Tensor | None = None  # [N] packed row of each predicted position, row-major

    @property
    def padded(self) -> bool:
        """Whether any position is padding (SDPA is faster without a mask when none is)."""
        return self.real_tokens < self.batch_size * self.width

    @property
    def padding_share(self) -> float:
        return 1.0 - self.real_tokens / max(self.batch_size * self.width, 1)

    def to(self, device, non_blocking: bool = False) -> "BatchLayout":
        return map_tensors(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "BatchLayout":  # DataLoader(pin_memory=True) calls it
        return map_tensors(self, lambda t: t.pin_memory())


def _tensor(a: np.ndarray) -> torch.Tensor:
    import torch  # the collator has loaded it

    return torch.from_numpy(np.ascontiguousarray(a))


def is_right_padded(real: np.ndarray) -> bool:
    """Every row is real tokens from position 0, then only padding (the packed path needs it)."""
    if not real.shape[1]:
        return not len(real)
    # No padding before a real token: the prefix test without comparing every position to its row's length.
    return bool(real[:, 0].all()) and not (real[:, 1:] & ~real[:, :-1]).any()


def plan_buckets(lengths: np.ndarray, max_buckets: int = MAX_BUCKETS) -> list[np.ndarray]:
    """Sequence indices per bucket: contiguous runs of the lengths sorted longest first, cut (dynamic
    programming, O(K·B²)) to minimise Σ size·longest², the attention work including padding."""
    order = np.argsort(-lengths, kind="stable")
    longest = lengths[order].astype(np.float64)
    B = len(longest)
    i, j = np.arange(B)[:, None], np.arange(B + 1)[None, :]
    cost = np.where(j > i, (j - i) * longest[:, None] ** 2, np.inf)  # [B, B+1]: one bucket of sorted i..j-1
    best = cost[0].copy()  # best[j]: cheapest cut of the first j sequences (one bucket so far)
    best[0] = 0.0
    choices = [np.zeros(B + 1, dtype=np.int64)]
    for _ in range(min(max_buckets, B) - 1):
        total = best[:B, None] + cost  # [B, B+1]: the last bucket starts at i
        start = total.argmin(0)
        split = total[start, np.arange(B + 1)]
        better = split < best  # ties keep fewer buckets
        choices.append(np.where(better, start, -1))
        best = np.where(better, split, best)
    bounds, end = [], B
    for choice in reversed(choices):  # walk back from the last round
        if end == 0:
            break
        if choice[end] >= 0:
            bounds.append((int(choice[end]), end))
            end = int(choice[end])
    return [order[s:e] for s, e in reversed(bounds)]


def _bucket(members: np.ndarray, lengths: np.ndarray, start: int) -> Bucket:
    size = lengths[members]
    b, width = len(members), int(size.max())
    if bool((size == width).all()):
        return Bucket(start, b * width, (b, width))
    column = np.arange(width)[None, :]
    seq_start = start + np.concatenate([[0], np.cumsum(size)[:-1]])
    gather = seq_start[:, None] + np.minimum(column, size[:, None] - 1)         # [b, width]
    inside = column < size[:, None]
    return Bucket(start, int(size.sum()), (b, width), _tensor(gather.reshape(-1).astype(np.int64)),
                  _tensor(inside)[:, None, None, :], _tensor(np.flatnonzero(inside).astype(np.int64)))


def pack_lengths(lengths: np.ndarray, width: int) -> tuple[Packing, np.ndarray]:
    """(packing of right-padded rows of these lengths, [B] packed row of each row's first position: position t
    of row b is packed row first[b] + t); host work only."""
    lengths = np.asarray(lengths, dtype=np.int64)
    sequence = np.argsort(-lengths, kind="stable")                            # batch rows, packed order
    sorted_lengths = lengths[sequence]
    ends = np.cumsum(sorted_lengths)
    sequence_start = ends - sorted_lengths
    start = int(ends[-1]) if len(ends) else 0
    position = np.arange(start) - np.repeat(sequence_start, sorted_lengths)   # [N]
    token_index = np.repeat(sequence * width, sorted_lengths)
    token_index += position
    first = np.empty(len(lengths), dtype=np.int64)
    first[sequence] = sequence_start
    starts = np.append(sequence_start, start).astype(np.int32)  # a GPU's variable-length attention reads these
    packing = Packing(_tensor(token_index), _tensor(position), _tensor(first), lengths, width, _tensor(starts),
                      int(sorted_lengths.max(initial=0)))
    return packing, first


def buckets_of(packing: Packing, max_buckets: int = MAX_BUCKETS) -> list[Bucket]:
    """The packing's length buckets (plan_buckets: contiguous runs of its longest-first order), made once, on the
    device of its tensors (a GPU's copies queued without waiting)."""
    if packing.buckets is None:
        buckets, start, device = [], 0, packing.token_index.device
        for members in plan_buckets(packing.lengths, max_buckets):
            buckets.append(map_tensors(_bucket(members, packing.lengths, start),
                                       lambda t: t.to(device, non_blocking=True)))
            start += buckets[-1].size
        packing.buckets = buckets
    return packing.buckets


def batch_layout(attention_mask: np.ndarray, labels: np.ndarray, sentence_label: np.ndarray | None = None
                 ) -> BatchLayout:
    """The layout of a [B, T] batch from its numpy mask and labels (CPU tensors; host work only)."""
    real = np.asarray(attention_mask).astype(bool, copy=False)
    labels = np.asarray(labels)
    B, T = real.shape
    predicted = labels != IGNORE_INDEX
    # Flat indices b * T + t, row-major like mask indexing (np.nonzero's order; flatnonzero is ~4x faster).
    flat = np.flatnonzero(predicted)
    rows_b, rows_t = np.divmod(flat, T)
    needed = predicted.copy()
    needed[:, 0] = True
    K = int((np.bincount(rows_b, minlength=B) + ~predicted[:, 0]).max()) if B else 1   # most needed in a row
    # Each row's needed positions ([CLS], then the predicted ones) first, ascending, then the others ascending:
    # argsort(~needed, stable)'s order, as a sort of distinct keys (2x faster than the argsort).
    key = (~needed) * np.int32(T)
    key += np.arange(T, dtype=np.int32)
    rows = np.sort(key, axis=1)[:, :K] % np.int32(T)                            # [B, K]
    labelled = 0 if sentence_label is None else int((np.asarray(sentence_label) != IGNORE_INDEX).sum())
    index = [flat, labels.reshape(-1)[flat], rows, np.flatnonzero(np.take_along_axis(predicted, rows, axis=1))]
    lengths = real.sum(1)
    layout = BatchLayout(B, T, int(len(flat)), int(lengths.sum()), labelled, K,
                         *(_tensor(np.asarray(a, dtype=np.int64)) for a in index))
    if B and is_right_padded(real) and not (predicted & ~real).any():
        layout.packing, first = pack_lengths(lengths, T)
        layout.predicted_rows = _tensor(first[rows_b] + rows_t)
    return layout


def layout_of(attention_mask: torch.Tensor | None, labels: torch.Tensor,
              sentence_label: torch.Tensor | None = None) -> BatchLayout:
    """batch_layout of device tensors, read back to the host: for tests, evaluation, inference; never the step."""
    mask = labels.new_ones(labels.shape) if attention_mask is None else attention_mask
    label = None if sentence_label is None else sentence_label.detach().cpu().numpy()
    layout = batch_layout(mask.detach().cpu().numpy(), labels.detach().cpu().numpy(), label)
    return layout if labels.device.type == "cpu" else layout.to(labels.device)

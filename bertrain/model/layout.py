"""What the host knows about a training micro-batch before it reaches the device: where the masked
positions are, their targets, the counts, and the packing of the unpadded path.

The loader's collator already holds the masks as numpy arrays, so it builds a BatchLayout there
(the train layer hands it `batch_layout`; data code never imports the model) and the step uses its
Python ints and index tensors instead of reading boolean masks back from the device: boolean
indexing, `int(mask.sum())` and `bool(mask.all())` each wait for the device. A forward
called without one (tests, evaluation, inference) builds it from the tensors (`layout_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertrain.model.packing import Packing, is_right_padded, pack_lengths

IGNORE_INDEX = -100


@dataclass
class BatchLayout:
    """Counts (Python ints) and index tensors of one [B, T] micro-batch with MLM labels."""

    batch_size: int
    width: int             # T
    predicted: int         # N: positions with a label (!= -100)
    real_tokens: int       # attention_mask.sum()
    labelled: int          # instances whose sentence label is not -100 (0 without sentence labels)
    max_needed: int        # K: most [CLS] + predicted positions in one row (the pruned last layer's width)
    mlm_index: torch.Tensor         # [N] flat b*T + t of the predicted positions, row-major
    targets: torch.Tensor           # [N] their labels
    needed_rows: torch.Tensor       # [B, K] [CLS] then the predicted positions ascending, padded (needed_rows)
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

    def _tensors(self) -> tuple:
        return self.mlm_index, self.targets, self.needed_rows, self.mlm_index_in_rows

    def _with(self, tensors: tuple, packing: Packing | None, predicted_rows: torch.Tensor | None) -> "BatchLayout":
        return BatchLayout(self.batch_size, self.width, self.predicted, self.real_tokens, self.labelled,
                           self.max_needed, *tensors, packing, predicted_rows)

    def to(self, device, non_blocking: bool = False) -> "BatchLayout":
        """The same layout with its tensors on `device` (non_blocking from pinned memory)."""
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return self._with(tuple(move(t) for t in self._tensors()),
                          None if self.packing is None else self.packing.to(device, non_blocking),
                          move(self.predicted_rows))

    def pin_memory(self) -> "BatchLayout":
        """Pinned copies (DataLoader's pin_memory calls this on CUDA)."""
        return self._with(tuple(t.pin_memory() for t in self._tensors()),
                          None if self.packing is None else self.packing.pin_memory(),
                          None if self.predicted_rows is None else self.predicted_rows.pin_memory())


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


def batch_layout(attention_mask: np.ndarray, labels: np.ndarray, sentence_label: np.ndarray | None = None
                 ) -> BatchLayout:
    """The layout of a [B, T] batch from its numpy mask and labels (CPU tensors; host work only)."""
    real = np.asarray(attention_mask).astype(bool)
    labels = np.asarray(labels)
    B, T = real.shape
    predicted = labels != IGNORE_INDEX
    rows_b, rows_t = np.nonzero(predicted)                                     # row-major, like mask indexing
    needed = predicted.copy()
    needed[:, 0] = True
    K = int(needed.sum(1).max()) if B else 1
    # A stable sort puts each row's needed positions ([CLS], then the predicted ones) first, ascending.
    rows = np.argsort(~needed, axis=1, kind="stable")[:, :K]                   # [B, K]
    in_rows_b, in_rows_k = np.nonzero(np.take_along_axis(predicted, rows, axis=1))
    labelled = 0 if sentence_label is None else int((np.asarray(sentence_label) != IGNORE_INDEX).sum())
    layout = BatchLayout(B, T, int(len(rows_b)), int(real.sum()), labelled, K, _tensor(rows_b * T + rows_t),
                         _tensor(labels[rows_b, rows_t]), _tensor(rows), _tensor(in_rows_b * K + in_rows_k))
    if B and is_right_padded(real) and not predicted[~real].any():
        layout.packing, row_of = pack_lengths(real.sum(1), T)
        layout.predicted_rows = _tensor(row_of[rows_b, rows_t])
    return layout


def layout_of(attention_mask: torch.Tensor | None, labels: torch.Tensor,
              sentence_label: torch.Tensor | None = None) -> BatchLayout:
    """batch_layout of device tensors, on their device. Reads them back to the host: for callers
    without a collator-made layout (tests, evaluation), not for the training step."""
    mask = torch.ones_like(labels) if attention_mask is None else attention_mask
    label = None if sentence_label is None else sentence_label.detach().cpu().numpy()
    layout = batch_layout(mask.detach().cpu().numpy(), labels.detach().cpu().numpy(), label)
    return layout if labels.device.type == "cpu" else layout.to(labels.device)

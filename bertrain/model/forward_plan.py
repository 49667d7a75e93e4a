"""How a forward with labels runs (encoder path, embedding gradient), decided once from host values, with the
reason: `padded`, `pruned` (last layer only at [CLS] and predicted rows) or `packed` (real tokens only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertrain.batch_layout import BatchLayout
from bertrain.config import AUTO_MIN_PADDED_WIDTH, AUTO_MIN_PADDING_SHARE


@dataclass(frozen=True)
class ForwardPlan:
    """The paths of one forward with labels, and why each was taken."""

    encoder: str                  # padded | pruned | packed
    sparse_embedding_grad: bool   # word-embedding gradient as rows (True) or a dense [V, E] tensor
    why: dict[str, str]           # {"encoder": reason, "embedding_grad": reason}


def plan_forward(model, layout: BatchLayout) -> ForwardPlan:
    """The plan of `model`'s forward on a batch of this layout (reads no device value)."""
    compiling, share, width = torch.compiler.is_compiling(), layout.padding_share, model.config.hidden_size
    if model.unpad == "false" or layout.packing is None or compiling:
        packed, why = False, ("model.unpad is false" if model.unpad == "false" else
                              "torch.compile: packing has data-dependent shapes" if compiling else
                              "rows not right-padded, or labels on padding: no packing")
    elif model.unpad == "true":
        packed, why = True, "model.unpad is true"
    else:
        packed = share > 0 and (share >= AUTO_MIN_PADDING_SHARE or share * width >= AUTO_MIN_PADDED_WIDTH)
        why = f"model.unpad auto: {share:.0%} padding at hidden size {width}"
    encoder = "packed" if packed else "pruned" if model.prune_last_layer else "padded"
    if not packed:
        why += "; last layer only where the losses look" if model.prune_last_layer else "; pruning off"
    # With labels the tied decoder always yields a dense embedding gradient, so autograd adds the lookup's
    # rows into it in place, saving a full-vocabulary allocation and pass per step.
    sparse = (model.sparse_embedding_grad and model.training and torch.is_grad_enabled()
              and model.decoder_weight.requires_grad and not compiling)
    grad_why = ("rows, added into the tied decoder's dense gradient" if sparse else
                "dense: option off" if not model.sparse_embedding_grad else
                "dense: torch.compile" if compiling else "dense: no gradient for the embeddings here")
    return ForwardPlan(encoder, sparse, {"encoder": why, "embedding_grad": grad_why})

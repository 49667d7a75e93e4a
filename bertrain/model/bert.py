"""BERT for pretraining: encoder, pooler, MLM head (tied decoder) and the 2-way sentence head (NSP).

`PreTrainingModel` holds everything BERT and ALBERT share (embeddings, pooler, heads, losses);
subclasses name their encoder. In training the MLM head runs only at positions whose label
is not -100: full-vocabulary logits at every position are most of the step for small models.
With labels the forward takes a BatchLayout (layout.py: where the labels are, as the collator saw
them) so that it never reads a tensor back to the host, and runs the unpadded encoder
(unpadded.py) when `model.unpad` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertrain.model.layers import Embeddings, EncoderLayer, MLMHead, attention_bias, init_weights, run_steps
from bertrain.model.layout import BatchLayout, layout_of
from bertrain.model.unpadded import unpadded_encode, use_unpadded


def embedding_size(config) -> int:
    """E: ALBERT's factorized embedding size, or H (BERT, or ALBERT with embedding_size null)."""
    return config.embedding_size if config.type == "albert" and config.embedding_size else config.hidden_size


@dataclass
class PreTrainingOutput:
    """What the model returns; losses and counts are None when their labels are not given."""

    loss: torch.Tensor | None
    mlm_loss: torch.Tensor | None       # mean over this batch's predicted tokens
    sentence_loss: torch.Tensor | None  # mean over this batch's labelled instances (label != -100)
    # [N, V] at labels != -100 (row-major) with labels, else [B, T, V]. In training (grad enabled, no
    # autocast) they live in a buffer the next forward overwrites, and carry no gradient: read what a
    # caller needs from the fields below, which are fresh tensors.
    mlm_logits: torch.Tensor
    sentence_logits: torch.Tensor  # [B, 2]
    mlm_predictions: torch.Tensor | None = None   # [N] argmax of mlm_logits
    mlm_correct: torch.Tensor | None = None       # how many mlm_predictions equal their label
    mlm_loss_sum: torch.Tensor | None = None      # mlm_loss * N, detached (for metrics summed over steps)
    sentence_correct: torch.Tensor | None = None
    sentence_loss_sum: torch.Tensor | None = None  # summed over labelled instances, detached
    sentence_count: torch.Tensor | None = None     # labelled instances (sentence label != -100)


def normalized(mean: torch.Tensor, count: int, normalizer: float | None) -> torch.Tensor:
    """`mean` over `count` items as their sum divided by `normalizer`; the mean itself when it is None."""
    if normalizer is None:
        return mean
    return mean.float() * count * (1.0 / normalizer)


class PreTrainingModel(nn.Module):
    """Shared pretraining wrapper: encode → pool [CLS] → MLM and sentence heads → losses."""

    prune_last_layer = True  # with labels, run the last layer only where the losses look (BatchLayout.needed_rows)
    sparse_embedding_grad = True  # with labels, see Embeddings.forward

    def __init__(self, config, encoder_class: type[nn.Module]):
        super().__init__()
        self.config = config
        self.gradient_checkpointing = config.gradient_checkpointing
        H, E = config.hidden_size, embedding_size(config)
        self.embeddings = Embeddings(config.vocab_size, E, config.max_position_embeddings, config.type_vocab_size,
                                     config.layer_norm_eps, config.hidden_dropout_prob)
        self.encoder = encoder_class(config)
        self.pooler = nn.Linear(H, H)
        self.mlm_head = MLMHead(H, E, config.vocab_size, config.hidden_act, config.layer_norm_eps)
        self.sentence_head = nn.Linear(H, 2)
        init_weights(self, config.initializer_range)
        self.unpad = getattr(config, "unpad", "auto")  # model.unpad: auto | true | false (unpadded.use_unpadded)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               token_type_ids: torch.Tensor | None, sparse_grad: bool = False,
               rows: torch.Tensor | None = None, padded: bool | None = None) -> torch.Tensor:
        """Final hidden states [B, T, H], or [B, K, H] at `rows` (BatchLayout.needed_rows; sparse_grad: see
        Embeddings.forward; padded: see attention_bias)."""
        x = self.embeddings(input_ids, token_type_ids, sparse_grad)  # [B, T, E]
        mask = attention_bias(attention_mask, padded)
        return self.encoder(x, mask, self.gradient_checkpointing and self.training, rows)

    @property
    def decoder_weight(self) -> torch.Tensor:
        """The MLM decoder weight: the word embeddings themselves (tied)."""
        return self.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sentence_label: torch.Tensor | None = None, mlm_normalizer: float | None = None,
                sentence_normalizer: float | None = None, layout: BatchLayout | None = None) -> PreTrainingOutput:
        """Logits, and with labels the losses and counts. The loss divides the summed MLM (sentence)
        cross-entropy by `mlm_normalizer` (`sentence_normalizer`); None: this batch's count, the mean.
        A data-parallel trainer passes global count / world size: DDP averages gradients over ranks,
        so every micro-batch of every rank then weighs each predicted token (instance) of the step alike.
        `layout`: the collator's BatchLayout of these labels (built here, with host reads, when absent)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if labels is None:
            hidden = self.encode(input_ids, attention_mask, token_type_ids)  # [B, T, H]
            first = hidden[:, 0]
            out = PreTrainingOutput(None, None, None, self.mlm_head(hidden, self.decoder_weight), None)  # [B, T, V]
        else:
            if layout is None:
                layout = layout_of(attention_mask, labels, sentence_label)
            first, out = self._masked_lm(input_ids, attention_mask, token_type_ids, layout, mlm_normalizer)
        out.sentence_logits = self.sentence_head(torch.tanh(self.pooler(first)))  # [B, 2]; rows start with [CLS]
        if sentence_label is not None:
            sentence_label = sentence_label.view(-1)  # [B]; -100: no sentence label (an MLM-only instance)
            labelled = sentence_label != -100
            loss_sum = F.cross_entropy(out.sentence_logits.float(), sentence_label, reduction="sum")
            out.sentence_count = labelled.sum()
            out.sentence_loss = loss_sum / out.sentence_count.clamp(min=1)  # a tensor divisor: no host read
            out.sentence_loss_sum = loss_sum.detach()
            out.sentence_correct = ((out.sentence_logits.detach().argmax(-1) == sentence_label) & labelled).sum()
            term = out.sentence_loss if sentence_normalizer is None else loss_sum * (1.0 / sentence_normalizer)
            out.loss = term if out.loss is None else out.loss + term
        elif out.loss is not None and self.training:
            # Same value; keeps pooler and sentence head in the graph so DDP (objective none) finds a
            # gradient for every parameter without find_unused_parameters.
            out.loss = out.loss + 0.0 * out.sentence_logits.float().sum()
        return out

    def _masked_lm(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor,
                   layout: BatchLayout, normalizer: float | None) -> tuple[torch.Tensor, PreTrainingOutput]:
        """[CLS] hidden states [B, H] and the MLM half of the output, decoding only where labels != -100."""
        targets = layout.targets  # [N], row-major
        # With labels the tied decoder always yields a dense embedding gradient, so the lookup's can be sparse.
        sparse_grad = (self.sparse_embedding_grad and self.training and torch.is_grad_enabled()
                       and self.decoder_weight.requires_grad
                       and not torch.compiler.is_compiling())
        if use_unpadded(self.unpad, layout, self.config.hidden_size):
            mlm_hidden, first = unpadded_encode(self, input_ids, token_type_ids, layout, sparse_grad)
        else:
            rows = layout.needed_rows if self.prune_last_layer else None
            hidden = self.encode(input_ids, attention_mask, token_type_ids, sparse_grad, rows,
                                 padded=layout.padded)  # [B, K or T, H]; rows start with [CLS]
            index = layout.mlm_index if rows is None else layout.mlm_index_in_rows
            mlm_hidden, first = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index), hidden[:, 0]
        # Gather first, then transform and decode: N ≈ 15% of B*T rows instead of all of them.
        mlm_loss, mlm_logits = self.mlm_head.loss(mlm_hidden, self.decoder_weight, targets)
        predictions = mlm_logits.detach().argmax(-1)  # now: training logits are overwritten by the next forward
        out = PreTrainingOutput(normalized(mlm_loss, layout.predicted, normalizer), mlm_loss, None, mlm_logits, None,
                                mlm_predictions=predictions, mlm_correct=(predictions == targets).sum(),
                                mlm_loss_sum=mlm_loss.detach().float() * layout.predicted)
        return first, out

    def num_parameters(self) -> int:
        """Unique parameters (shared ALBERT layers and the tied decoder counted once)."""
        return sum(p.numel() for p in self.parameters())


class BertEncoder(nn.Module):
    """A stack of independent post-LayerNorm layers."""

    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))

    def steps(self) -> list[nn.Module]:
        """The layers in the order they are applied."""
        return list(self.layers)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool = False,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        return run_steps(self.steps(), x, mask, checkpointing, rows)


class BertPreTrainingModel(PreTrainingModel):
    """BERT (Devlin et al. 2018) with MLM and NSP heads, weights laid out like BertForPreTraining."""

    def __init__(self, config):
        super().__init__(config, BertEncoder)

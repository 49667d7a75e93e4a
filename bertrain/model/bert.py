"""BERT for pretraining; `PreTrainingModel` holds what BERT and ALBERT share. With labels the MLM head runs only
at labelled positions (full-vocabulary logits are most of a small model's step)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertrain.batch_layout import IGNORE_INDEX, BatchLayout, layout_of
from bertrain.model.forward_plan import plan_forward
from bertrain.model.layers import Embeddings, EncoderLayer, MLMHead, attention_bias, init_weights, run_steps


def embedding_size(config) -> int:
    """E: ALBERT's factorized embedding size, or H (BERT, or ALBERT with embedding_size null)."""
    return config.embedding_size if config.type == "albert" and config.embedding_size else config.hidden_size


@dataclass
class PreTrainingOutput:
    """What the model returns; losses and counts are None when their labels are not given."""

    loss: torch.Tensor | None
    mlm_loss: torch.Tensor | None       # mean over this batch's predicted tokens
    sentence_loss: torch.Tensor | None  # mean over this batch's labelled instances
    mlm_logits: torch.Tensor            # [N, V] at the labelled positions (row-major) with labels, else [B, T, V]
    sentence_logits: torch.Tensor  # [B, 2]
    mlm_predictions: torch.Tensor | None = None   # [N] argmax of mlm_logits
    mlm_correct: torch.Tensor | None = None       # how many mlm_predictions equal their label
    mlm_loss_sum: torch.Tensor | None = None      # mlm_loss * N, detached (for metrics summed over steps)
    sentence_correct: torch.Tensor | None = None
    sentence_loss_sum: torch.Tensor | None = None  # summed over labelled instances, detached
    sentence_count: torch.Tensor | None = None     # labelled instances


class PreTrainingModel(nn.Module):
    """Shared pretraining wrapper: encode → pool [CLS] → MLM and sentence heads → losses.
    prune_last_layer, sparse_embedding_grad: the forward's options with labels (forward_plan.py); fused_weight_cast:
    each encoder layer's weights cast in one kernel under autocast (EncoderLayer.weights); on unless a test or
    benchmark compares against the plain path."""

    def __init__(self, config, encoder_class: type[nn.Module], *, prune_last_layer: bool = True,
                 sparse_embedding_grad: bool = True, fused_weight_cast: bool = True):
        super().__init__()
        self.config = config
        self.unpad = getattr(config, "unpad", "auto")  # model.unpad: auto | true | false
        self.prune_last_layer, self.sparse_embedding_grad = prune_last_layer, sparse_embedding_grad
        self.gradient_checkpointing = config.gradient_checkpointing
        H, E = config.hidden_size, embedding_size(config)
        float32_residual = getattr(config, "float32_residual", False)
        self.embeddings = Embeddings(config.vocab_size, E, config.max_position_embeddings, config.type_vocab_size,
                                     config.layer_norm_eps, config.hidden_dropout_prob, float32_residual)
        self.encoder = encoder_class(config)
        self.pooler = nn.Linear(H, H)
        self.mlm_head = MLMHead(H, E, config.vocab_size, config.hidden_act, config.layer_norm_eps, float32_residual)
        self.sentence_head = nn.Linear(H, 2)
        init_weights(self, config.initializer_range)
        for layer in self.modules():
            if isinstance(layer, EncoderLayer):
                layer.fused_weight_cast = fused_weight_cast

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states [B, T, H] (every layer at every position)."""
        x = self.embeddings(input_ids, token_type_ids)  # [B, T, E]
        return self.encoder(x, attention_bias(attention_mask), self.gradient_checkpointing and self.training)

    @property
    def decoder_weight(self) -> torch.Tensor:
        """The MLM decoder weight: the word embeddings themselves (tied)."""
        return self.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sentence_label: torch.Tensor | None = None, mlm_normalizer: float | None = None,
                sentence_normalizer: float | None = None, layout: BatchLayout | None = None) -> PreTrainingOutput:
        """Logits, and with labels the losses and counts: summed cross-entropy / `mlm_normalizer`
        (`sentence_normalizer`); None: the mean. DDP passes global count / world size so every token of the
        step weighs alike. `layout`: the collator's BatchLayout (built here, with host reads, when absent)."""
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
            sentence_label = sentence_label.view(-1)  # [B]; IGNORE_INDEX: an MLM-only instance
            labelled = sentence_label != IGNORE_INDEX
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
        """[CLS] hidden states [B, H] and the MLM half of the output, decoding only at the labelled positions."""
        plan = plan_forward(self, layout)
        checkpointing = self.gradient_checkpointing and self.training
        if plan.encoder == "packed":
            packing = layout.packing
            x = self.embeddings(input_ids, token_type_ids, plan.sparse_embedding_grad, packing)  # [N, E]
            rows = torch.cat([packing.first_rows, layout.predicted_rows])  # [CLS] rows, then predicted ones
            hidden = self.encoder(x, packing, checkpointing, rows)  # [B + N_pred, H]
            first, mlm_hidden = hidden[:layout.batch_size], hidden[layout.batch_size:]
        else:
            pruned = plan.encoder == "pruned"
            x = self.embeddings(input_ids, token_type_ids, plan.sparse_embedding_grad)  # [B, T, E]
            hidden = self.encoder(x, attention_bias(attention_mask, layout.padded), checkpointing,
                                  layout.needed_rows if pruned else None)  # [B, K or T, H]; rows start with [CLS]
            index = layout.mlm_index_in_rows if pruned else layout.mlm_index
            mlm_hidden, first = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index), hidden[:, 0]
        # Gather first, then transform and decode: N ≈ 15% of B*T rows instead of all of them.
        mlm_loss, mlm_logits = self.mlm_head.loss(mlm_hidden, self.decoder_weight, layout.targets)
        predictions = mlm_logits.detach().argmax(-1)
        loss = mlm_loss if normalizer is None else mlm_loss.float() * layout.predicted * (1.0 / normalizer)
        out = PreTrainingOutput(loss, mlm_loss, None, mlm_logits, None,
                                mlm_predictions=predictions, mlm_correct=(predictions == layout.targets).sum(),
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

    def forward(self, x: torch.Tensor, where, checkpointing: bool = False, rows: torch.Tensor | None = None
                ) -> torch.Tensor:
        """`where`, `rows`: see EncoderLayer.forward."""
        return run_steps(self.steps(), x, where, checkpointing, rows)


class BertPreTrainingModel(PreTrainingModel):
    """BERT (Devlin et al. 2018) with MLM and NSP heads, weights laid out like BertForPreTraining."""

    def __init__(self, config, **options):
        super().__init__(config, BertEncoder, **options)

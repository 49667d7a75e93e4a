"""What ALBERT changes: factorized embeddings (E, then E→H) and cross-layer sharing (step i uses group
i * num_hidden_groups // num_hidden_layers, as AlbertTransformer does); SOP sentence head."""

from __future__ import annotations

import torch
from torch import nn

from bertrain.model.bert import PreTrainingModel, embedding_size
from bertrain.model.layers import EncoderLayer, run_steps


class AlbertEncoder(nn.Module):
    """Mapping E→H, then groups of shared layers applied num_hidden_layers times."""

    def __init__(self, config):
        super().__init__()
        self.num_steps = config.num_hidden_layers
        self.embedding_to_hidden = nn.Linear(embedding_size(config), config.hidden_size)
        self.groups = nn.ModuleList(
            nn.ModuleList(EncoderLayer(config) for _ in range(config.inner_group_num))
            for _ in range(config.num_hidden_groups))

    def steps(self) -> list[nn.Module]:
        """The layers in the order they are applied: step i runs group i * groups // steps, whole."""
        return [layer for step in range(self.num_steps)
                for layer in self.groups[step * len(self.groups) // self.num_steps]]

    def forward(self, x: torch.Tensor, where, checkpointing: bool = False, rows: torch.Tensor | None = None
                ) -> torch.Tensor:
        """`where`, `rows`: see EncoderLayer.forward."""
        x = self.embedding_to_hidden(x)  # [B, T, E] → [B, T, H] (packed: [N, E] → [N, H])
        return run_steps(self.steps(), x, where, checkpointing, rows)


class AlbertPreTrainingModel(PreTrainingModel):
    """ALBERT (Lan et al. 2019) with MLM and SOP heads, weights laid out like AlbertForPreTraining."""

    def __init__(self, config, **options):
        super().__init__(config, AlbertEncoder, **options)

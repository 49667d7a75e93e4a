"""A model built from a bertrain checkpoint (for export and fill-mask): its config.yaml and model.safetensors."""

from __future__ import annotations

import warnings
from pathlib import Path

from bertrain import rundir
from bertrain.config import ConfigWarning, ModelConfig, load_config
from bertrain.model import PreTrainingModel, build_model, load_weights


def model_from_checkpoint(path: str | Path, skipped: list[tuple[Path, str]] | None = None
                          ) -> tuple[PreTrainingModel, ModelConfig, Path]:
    """(model in eval mode, model config, checkpoint dir) from a checkpoint dir or RUN_DIR; unpickles nothing."""
    checkpoint = rundir.resolve_checkpoint(path, skipped)
    with warnings.catch_warnings():  # the run's own config: its warnings were said when it started
        warnings.simplefilter("ignore", ConfigWarning)
        config = load_config(checkpoint / rundir.CONFIG).model
    model = build_model(config)
    load_weights(model, checkpoint / rundir.WEIGHTS)
    model.eval()
    return model, config, checkpoint

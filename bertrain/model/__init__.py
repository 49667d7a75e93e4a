"""BERT and ALBERT for pretraining (build_model) and their weights on disk. hf.py and fill_mask.py are not
imported here, so loading the models does not load them."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file

from bertrain.config import validate_model
from bertrain.errors import ConfigError, DataError
from bertrain.model.bert import BertPreTrainingModel, PreTrainingModel, PreTrainingOutput
from bertrain.model.albert import AlbertPreTrainingModel
from bertrain.model.layers import compile_layers

__all__ = ["build_model", "compile_layers", "save_weights", "load_weights", "unwrap",
           "PreTrainingModel", "PreTrainingOutput", "BertPreTrainingModel", "AlbertPreTrainingModel"]


def build_model(model_config, **options) -> PreTrainingModel:
    """A freshly initialized BERT or ALBERT (vocab_size set); `options`: the forward's switches."""
    c = model_config
    if c.vocab_size is None:
        raise ConfigError("model.vocab_size is not set: take it from the prepared data's manifest "
                          "(the trainer does) or set it, e.g. --set model.vocab_size=30522.")
    validate_model(c)  # a hand-built ModelConfig gets the checks a loaded config got
    if c.type == "albert":
        return AlbertPreTrainingModel(c, **options)
    if c.type == "bert":
        return BertPreTrainingModel(c, **options)
    raise ConfigError(f"model.type must be 'bert' or 'albert', not {c.type!r}.")


def unwrap(model):
    """The PreTrainingModel inside DDP / accelerate / torch.compile wrappers."""
    while not isinstance(model, PreTrainingModel):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"not a bertrain PreTrainingModel: {type(model).__name__}")
        model = inner
    return model


def save_weights(model, path: str | Path) -> None:
    """Write the state dict as safetensors. Identical weights give identical bytes: metadata is written in
    hash-map order, so it holds a single key."""
    state = {name: tensor.detach().contiguous() for name, tensor in unwrap(model).state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})


def load_weights(model, path: str | Path) -> None:
    """Load weights written by save_weights; any missing, unexpected or mis-shaped key is an error."""
    model = unwrap(model)
    try:
        state = load_file(str(path))
    except (OSError, ValueError, RuntimeError) as error:
        raise DataError(f"Cannot read model weights {path}: {error}") from None
    details = shape_differences(shapes_of(model.state_dict()), shapes_of(state))
    if details:
        raise DataError(f"Weights in {path} do not fit this model ({details}). Was the checkpoint written "
                        "with a different model config?")
    model.load_state_dict(state)


def shapes_of(state: dict) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape by name."""
    return {name: tuple(tensor.shape) for name, tensor in state.items()}


def shape_differences(own: dict[str, tuple[int, ...]], theirs: dict[str, tuple[int, ...]]) -> str:
    """'missing [...]; unexpected [...]; shape differs for NAME (theirs) vs (own)', five of each; "" when they fit."""
    missing, unexpected = sorted(own.keys() - theirs.keys()), sorted(theirs.keys() - own.keys())
    wrong = sorted(name for name in own.keys() & theirs.keys() if own[name] != theirs[name])
    return "; ".join(part for part in (
        f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
        "shape differs for " + ", ".join(f"{name} {theirs[name]} vs {own[name]}" for name in wrong[:5])
        if wrong else "") if part)


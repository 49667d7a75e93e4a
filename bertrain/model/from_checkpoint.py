"""A model built from a bertrain checkpoint (for export and fill-mask): its config.yaml and model.safetensors;
and what `model.init_from` checks before it loads weights: the tokenizer, the shapes, an unfinished run."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError, safe_open

from bertrain import rundir
from bertrain.config import ConfigWarning, ModelConfig, load_config
from bertrain.errors import BertrainError, ConfigError
from bertrain.files import file_sha256
from bertrain.model import PreTrainingModel, build_model, load_weights, shape_differences, shapes_of
from bertrain.tokenizer_file import load_tokenizer

POSITIONS = "embeddings.position_embeddings.weight"
WORDS = "embeddings.word_embeddings.weight"
ARCHITECTURE_NAMES = {"bert": "BERT", "albert": "ALBERT"}
WITH_ARTICLE = {"bert": "a BERT", "albert": "an ALBERT"}


def model_from_checkpoint(path: str | Path, skipped: list[tuple[Path, str]] | None = None
                          ) -> tuple[PreTrainingModel, ModelConfig, Path]:
    """(model in eval mode, model config, checkpoint dir) from a checkpoint dir or RUN_DIR; unpickles nothing."""
    checkpoint = rundir.resolve_checkpoint(path, skipped)
    config = _quiet_config(checkpoint).model
    model = build_model(config)
    load_weights(model, checkpoint / rundir.WEIGHTS)
    model.eval()
    return model, config, checkpoint


def _quiet_config(checkpoint: Path):
    with warnings.catch_warnings():  # the run's own config: its warnings were said when it started
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(checkpoint / rundir.CONFIG)


# -- model.init_from checks ----------------------------------------------------------------------


def read_vocabulary(directory: Path) -> dict[str, int] | None:
    """token → id of a directory's tokenizer.json (else its vocab.txt, as Google's BERT dirs); None if neither."""
    if (directory / "tokenizer.json").is_file():
        return load_tokenizer(directory).get_vocab(with_added_tokens=True)
    if (directory / "vocab.txt").is_file():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
        return {token: token_id for token_id, token in enumerate(lines)}
    return None


def check_vocabulary(there: dict[str, int], here: dict[str, int], label: str, source_dir: Path,
                     rows_fit: bool, warn: Callable[[str], None]) -> None:
    """Refuse weights whose ids mean other tokens than this run's tokenizer; warn for a fitting extension."""
    token_there = {token_id: token for token, token_id in there.items()}
    token_here = {token_id: token for token, token_id in here.items()}
    differ = sorted(i for i in token_here.keys() & token_there.keys() if token_here[i] != token_there[i])
    advice = (f"Prepare this run's data with that tokenizer (bertrain prepare ... --tokenizer {source_dir}) and "
              "pass that DATA_DIR to --data.")
    if differ:
        # Ids in the middle of the vocabulary are words; the first ones are often specials and single characters.
        examples = [differ[len(differ) // 2]] + ([differ[-1]] if len(differ) > 1 else [])
        shown = "; ".join(f"id {i} is {token_there[i]!r} there, {token_here[i]!r} here" for i in examples)
        raise ConfigError(f"model.init_from: {label} was trained with another tokenizer than this run's DATA_DIR: "
                          f"{len(differ)} of {len(token_here)} ids mean a different token ({shown}), so its "
                          f"embeddings would start from other tokens' vectors. {advice}")
    added = sorted(token_here.keys() - token_there.keys())
    if added and not rows_fit:
        raise ConfigError(f"model.init_from: this run's tokenizer extends the one of {label} with {len(added)} "
                          "tokens, but its embedding table has another number of rows than this model's "
                          f"(model.vocab_size) and bertrain does not resize it. {advice}")
    if added:
        warn(f"model.init_from: this run's tokenizer extends the one of {label} with {len(added)} tokens "
             f"(ids {added[0]}-{added[-1]}); their embedding rows start untrained.")


def check_checkpoint_tokenizer(checkpoint: Path, run_tokenizer: Path, here: dict[str, int], rows_fit: bool,
                               warn: Callable[[str], None]) -> None:
    """Compare a bertrain checkpoint's tokenizer (its copy, RUN_DIR/tokenizer, or the sha256 its data record holds)."""
    record = _data_record(checkpoint)
    recorded = record.get("tokenizer_sha256")
    if recorded and recorded == file_sha256(run_tokenizer / "tokenizer.json"):
        return
    source = rundir.find_tokenizer_dir(checkpoint)
    if source is None and recorded:  # the DATA_DIR phase 1 trained on, if it still holds that tokenizer
        data_tokenizer = Path(record.get("path", "")) / rundir.TOKENIZER
        if (data_tokenizer / "tokenizer.json").is_file() and file_sha256(data_tokenizer / "tokenizer.json") == recorded:
            source = data_tokenizer
    if source is None:
        warn(f"model.init_from: checkpoint {checkpoint} has no tokenizer to compare with this run's "
             f"({'its recorded sha256 differs' if recorded else 'nor a record of it'}); make sure this run's data "
             "was prepared with phase 1's tokenizer.")
        return
    check_vocabulary(read_vocabulary(source), here, f"checkpoint {checkpoint}", source, rows_fit, warn)


def _data_record(checkpoint: Path) -> dict:
    try:
        record = json.loads((checkpoint / rundir.DATA_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def unfinished_run_warning(checkpoint: Path) -> str | None:
    """A warning when the checkpoint is from a run that had not reached its budget (stopped, preempted)."""
    try:
        state = json.loads((checkpoint / rundir.TRAIN_STATE).read_text(encoding="utf-8"))
        train = _quiet_config(checkpoint).train
        step, tokens = int(state["step"]), int(state.get("tokens_seen", 0))
    except (OSError, ValueError, KeyError, TypeError, BertrainError):
        return None  # nothing to tell from
    if train.max_tokens is not None:
        if tokens >= train.max_tokens:
            return None
        where = f"step {step} ({tokens:,} tokens) of a {train.max_tokens:,}-token run"
    elif step >= train.max_steps:
        return None
    else:
        where = f"step {step} of a {train.max_steps}-step run"
    run_dir = checkpoint.parent.parent
    newest = rundir.find_latest_checkpoint(run_dir) if checkpoint.parent.name == rundir.CHECKPOINTS else None
    if newest is not None and newest != checkpoint:
        return (f"model.init_from: checkpoint {checkpoint} is {where}; not its newest checkpoint ({newest.name}). "
                "Training starts from these earlier weights.")
    return (f"model.init_from: checkpoint {checkpoint} is {where} that did not finish (stopped or preempted). "
            f"Training starts from these partial weights; to finish phase 1 first, run its pretrain command again "
            f"(it resumes in {run_dir}).")


def weight_shapes(weights: Path) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape from a safetensors header (no tensor is read); None when the file cannot be read."""
    try:
        with safe_open(str(weights), framework="pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return None


def architecture_of(shapes: dict[str, tuple[int, ...]]) -> str | None:
    """'bert' or 'albert' from our parameter names (ALBERT's shared layer groups), None for neither."""
    if any(name.startswith("encoder.groups.") for name in shapes):
        return "albert"
    if any(name.startswith("encoder.layers.") for name in shapes):
        return "bert"
    return None


def architecture_error(label: str, theirs: str, mine: str) -> ConfigError:
    """A BERT checkpoint into an ALBERT config or the reverse, said in one sentence before what to do."""
    return ConfigError(f"model.init_from: {label} is {WITH_ARTICLE[theirs]} checkpoint but this config is "
                       f"{ARCHITECTURE_NAMES[mine]} (model.type: {mine}). Set model.type: {theirs} and the rest of "
                       f"the model section to the checkpoint's, or point model.init_from at {WITH_ARTICLE[mine]} "
                       "checkpoint.")


def position_hint(rows_there: int, rows_here: int) -> str:
    """What to do when the source's position table is shorter than this config's max_position_embeddings."""
    if rows_there >= rows_here:
        return ""
    return (f" Its position table has {rows_there} rows, this config's model.max_position_embeddings is "
            f"{rows_here}: phase 1 must be trained with model.max_position_embeddings >= the phase-2 length (as BERT "
            f"does: the table is sized for 512 from phase 1 on, which trains on shorter sequences). Train phase 1 "
            f"with --set model.max_position_embeddings={rows_here}, or keep this run within {rows_there} positions "
            f"(model.max_position_embeddings and data.max_seq_length <= {rows_there}).")


def check_weights_fit(model, weights: Path, shapes: dict[str, tuple[int, ...]] | None, label: str) -> None:
    """Refuse (ConfigError, exit 2) bertrain weights whose names or shapes differ from the model's."""
    if shapes is None:
        return  # load_weights says why the file cannot be read
    own = shapes_of(model.state_dict())
    details = shape_differences(own, shapes)
    if not details:
        return
    theirs = architecture_of(shapes)
    if theirs is not None and theirs != model.config.type:
        raise architecture_error(label, theirs, model.config.type)
    there, mine = shapes.get(POSITIONS), own.get(POSITIONS)
    hint = position_hint(there[0], mine[0]) if there and mine else ""  # "" unless their table is the shorter
    raise ConfigError(f"model.init_from: the weights in {weights} do not fit this model config ({details})."
                      + (hint or " Set the model section to the checkpoint's shape."))

"""`model.init_from` (phase 2, continued pretraining): the checks before weights are loaded (the tokenizer,
shapes and architecture, an unfinished phase 1) and what a run with init_from says when it starts."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from bertrain import rundir
from bertrain.config import Config, dump_yaml, load_config
from bertrain.data.format import open_prepared
from bertrain.errors import ConfigError
from bertrain.model import build_model, save_weights
from bertrain.model.hf import export_hf, initialize_from
from bertrain.train.checkpoint import begin_save, finish_save
from tests.helpers import write_config

SPECIAL_IDS = 5  # [PAD] [UNK] [CLS] [SEP] [MASK]: kept in place by every variant below


@pytest.fixture(scope="module")
def run_config(tiny_data, tmp_path_factory) -> tuple[Path, Config]:
    """The phase-2 config file (TINY) and its config with the DATA_DIR's vocab_size, as the trainer resolves it."""
    path = write_config(tmp_path_factory.mktemp("config") / "tiny.yaml")
    config = load_config(path)
    vocab_size = open_prepared(tiny_data).vocab_size
    return path, dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=vocab_size))


def tokenizer_variant(data_dir: Path, out: Path, change) -> Path:
    """A copy of DATA_DIR's tokenizer whose token → id map went through `change`; returns the tokenizer dir."""
    tree = json.loads((data_dir / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    tree["model"]["vocab"] = change(dict(tree["model"]["vocab"]))
    out.mkdir(parents=True)
    (out / "tokenizer.json").write_text(json.dumps(tree, indent=1), encoding="utf-8")
    return out


def rotated(vocab: dict[str, int]) -> dict[str, int]:
    """Every non-special token one id further (same size, other ids): a tokenizer trained on other text."""
    size = len(vocab)
    return {t: i if i < SPECIAL_IDS else SPECIAL_IDS + (i - SPECIAL_IDS + 1) % (size - SPECIAL_IDS)
            for t, i in vocab.items()}


def without_last(count: int):
    return lambda vocab: {t: i for t, i in vocab.items() if i < len(vocab) - count}


def write_phase1(run_dir: Path, config: Config, tokenizer: Path | None, step: int = 6, max_steps: int = 6,
                 tokenizer_sha256: str = "0" * 64) -> Path:
    """A phase-1 RUN_DIR as the trainer leaves it (one complete checkpoint, RUN_DIR/tokenizer); its checkpoint."""
    torch.manual_seed(1)
    model = build_model(config.model)
    directory = begin_save(run_dir, step)
    save_weights(model, directory / rundir.WEIGHTS)
    (directory / rundir.CONFIG).write_text(dump_yaml(dataclasses.replace(
        config, train=dataclasses.replace(config.train, max_steps=max_steps))))
    (directory / rundir.TRAIN_STATE).write_text(json.dumps({"step": step, "tokens_seen": 100 * step}))
    (directory / rundir.DATA_INFO).write_text(json.dumps({"tokenizer_sha256": tokenizer_sha256, "path": "/nowhere"}))
    checkpoint = finish_save(directory)
    if tokenizer is not None:
        shutil.copytree(tokenizer, run_dir / rundir.TOKENIZER)
    return checkpoint


def loaded_with_warnings(model, source, tokenizer_dir) -> tuple[str, list[str]]:
    said: list[str] = []
    return initialize_from(model, source, tokenizer_dir, warn=said.append), said


# -- the tokenizer ----------------------------------------------------------------------------------


def test_phase1_of_another_vocabulary_is_refused_with_exit_2_naming_ids_and_what_to_do(
        tiny_data, run_config, tmp_path, run_cli):
    path, config = run_config
    other = tokenizer_variant(tiny_data, tmp_path / "other", rotated)
    write_phase1(tmp_path / "p1", config, other)
    code, out, err = run_cli("pretrain", "--config", str(path), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "p2"), "--dry-run", "--set", f"model.init_from={tmp_path / 'p1'}")
    assert code == 2, out + err
    size = len(json.loads((other / "tokenizer.json").read_text())["model"]["vocab"])
    assert f"{size - SPECIAL_IDS} of {size} ids mean a different token" in err
    assert "there, '" in err and "' here" in err  # an example: id N is 'x' there, 'y' here
    assert f"--tokenizer {tmp_path / 'p1' / 'tokenizer'}" in err
    assert "Traceback" not in err


def test_the_same_vocabulary_in_another_file_loads_and_the_start_says_the_optimizer_is_fresh(
        tiny_data, run_config, tmp_path, run_cli):
    path, config = run_config
    write_phase1(tmp_path / "p1", config, tokenizer_variant(tiny_data, tmp_path / "same", lambda vocab: vocab))
    code, out, err = run_cli("pretrain", "--config", str(path), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "p2"), "--dry-run", "--set", f"model.init_from={tmp_path / 'p1'}")
    assert code == 0, out + err
    assert "Initialized from bertrain checkpoint" in out
    assert "optimizer and lr schedule start fresh (step 0)" in " ".join(out.split())
    assert "tokenizer" not in err


def test_a_vocabulary_that_only_extends_phase1s_warns_when_the_rows_fit_and_is_refused_when_not(
        tiny_data, run_config, tmp_path):
    _, config = run_config
    shorter = tokenizer_variant(tiny_data, tmp_path / "shorter", without_last(3))
    # Phase 1 sized its embedding for the phase-2 vocabulary already (model.vocab_size): the rows fit.
    checkpoint = write_phase1(tmp_path / "fits", config, shorter)
    _, said = loaded_with_warnings(build_model(config.model), checkpoint, tiny_data / "tokenizer")
    size = config.model.vocab_size
    assert any(f"extends the one of checkpoint {checkpoint} with 3 tokens (ids {size - 3}-{size - 1})" in s
               for s in said), said
    small = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=size - 3))
    write_phase1(tmp_path / "small", small, shorter)
    with pytest.raises(ConfigError, match="extends .* with 3 tokens.*does not resize"):
        initialize_from(build_model(config.model), tmp_path / "small", tiny_data / "tokenizer")


def test_a_checkpoint_without_a_tokenizer_is_checked_by_the_recorded_sha256_else_warns(tiny_data, run_config,
                                                                                       tmp_path):
    _, config = run_config
    checkpoint = write_phase1(tmp_path / "p1", config, tokenizer=None)
    _, said = loaded_with_warnings(build_model(config.model), checkpoint, tiny_data / "tokenizer")
    assert any("has no tokenizer to compare" in s for s in said), said
    record = json.loads((tiny_data / "manifest.json").read_text())["tokenizer"]["sha256"]
    checkpoint = write_phase1(tmp_path / "recorded", config, tokenizer=None, tokenizer_sha256=record)
    _, said = loaded_with_warnings(build_model(config.model), checkpoint, tiny_data / "tokenizer")
    assert said == []


def test_a_bare_safetensors_file_loads_with_a_warning_that_its_vocabulary_was_not_checked(run_config, tiny_data,
                                                                                          tmp_path):
    _, config = run_config
    source = build_model(config.model)
    save_weights(source, tmp_path / "weights.safetensors")
    model = build_model(config.model)
    _, said = loaded_with_warnings(model, tmp_path / "weights.safetensors", tiny_data / "tokenizer")
    assert any("without a tokenizer" in s and "could not be checked" in s for s in said), said
    assert torch.equal(model.embeddings.word_embeddings.weight, source.embeddings.word_embeddings.weight)


def test_an_export_dir_is_compared_by_its_tokenizer_json_or_warned_about_without_one(run_config, tiny_data,
                                                                                    tmp_path):
    _, config = run_config
    model = build_model(config.model)
    other = tokenizer_variant(tiny_data, tmp_path / "other", rotated)
    export_hf(model, tmp_path / "hf", tokenizer_dir=other)
    with pytest.raises(ConfigError, match="ids mean a different token"):
        initialize_from(build_model(config.model), tmp_path / "hf", tiny_data / "tokenizer")
    export_hf(model, tmp_path / "bare")
    _, said = loaded_with_warnings(build_model(config.model), tmp_path / "bare", tiny_data / "tokenizer")
    assert any("could not be checked" in s for s in said), said


# -- an unfinished phase 1 ------------------------------------------------------------------------


def test_a_checkpoint_of_a_run_that_did_not_finish_warns_with_its_step_and_planned_total(run_config, tiny_data,
                                                                                        tmp_path, run_cli):
    path, config = run_config
    write_phase1(tmp_path / "stopped", config, tiny_data / "tokenizer", step=28, max_steps=200)
    code, out, err = run_cli("pretrain", "--config", str(path), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "p2"), "--dry-run", "--set", f"model.init_from={tmp_path / 'stopped'}")
    assert code == 0, out + err
    assert "Warning:" in err and "is step 28 of a 200-step run that did not finish" in " ".join(err.split())
    write_phase1(tmp_path / "done", config, tiny_data / "tokenizer", step=6, max_steps=6)
    _, said = loaded_with_warnings(build_model(config.model), tmp_path / "done", tiny_data / "tokenizer")
    assert said == []


# -- weights that do not fit --------------------------------------------------------------------


def test_a_shorter_position_table_is_a_config_error_saying_phase1_needs_the_phase2_length(run_config, tiny_data,
                                                                                         tmp_path):
    _, config = run_config
    write_phase1(tmp_path / "p1", config, tiny_data / "tokenizer")
    longer = dataclasses.replace(config.model, max_position_embeddings=128)
    with pytest.raises(ConfigError) as raised:
        initialize_from(build_model(longer), tmp_path / "p1", tiny_data / "tokenizer")
    message = str(raised.value)
    assert "position table has 64 rows" in message and "model.max_position_embeddings >= the phase-2 length" in message
    assert "--set model.max_position_embeddings=128" in message


def test_a_bert_checkpoint_into_an_albert_config_says_so_first_and_exits_2(run_config, tiny_data, tmp_path,
                                                                           run_cli):
    path, config = run_config
    write_phase1(tmp_path / "p1", config, tiny_data / "tokenizer")
    code, out, err = run_cli("pretrain", "--config", str(path), "--data", str(tiny_data), "--run-dir",
                             str(tmp_path / "p2"), "--dry-run", "--set", f"model.init_from={tmp_path / 'p1'}",
                             "--set", "model.type=albert", "--set", "model.embedding_size=16")
    assert code == 2, out + err
    assert "is a BERT checkpoint but this config is ALBERT" in " ".join(err.split())
    albert = dataclasses.replace(config.model, type="albert", embedding_size=16)
    export_hf(build_model(albert), tmp_path / "hf_albert")
    with pytest.raises(ConfigError, match="is an ALBERT checkpoint but this config is BERT"):
        initialize_from(build_model(config.model), tmp_path / "hf_albert")


def test_a_safetensors_file_of_another_shape_is_a_config_error(run_config, tmp_path):
    _, config = run_config
    save_weights(build_model(config.model), tmp_path / "weights.safetensors")
    wider = dataclasses.replace(config.model, intermediate_size=128)
    with pytest.raises(ConfigError, match="do not fit this model config .*shape differs"):
        initialize_from(build_model(wider), tmp_path / "weights.safetensors")

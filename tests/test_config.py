"""The config system: typed loading, errors that name the key, overrides, shipped-name lookup."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertrain.config import (Config, Recipe, config_reference_markdown, dump_yaml, load_config, load_recipe,
                             resolve_config_path)
from bertrain.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_file_and_overrides_layer(tmp_path):
    path = write(tmp_path, """
        optim:
          lr: 1e-4
          betas: [0.9, 0.98]
        train:
          batch_size: 64
    """)
    config = load_config(path, ["optim.lr=3e-4", "train.max_steps=null", "model.type=albert"])
    assert isinstance(config, Config)
    assert config.optim.lr == pytest.approx(3e-4) and isinstance(config.optim.lr, float)
    assert config.optim.betas == [0.9, 0.98]
    assert config.train.batch_size == 64
    assert config.train.max_steps is None
    assert config.model.type == "albert"
    assert config.data.max_seq_length == 128  # untouched default


def test_exponent_without_dot_is_a_float(tmp_path):
    # PyYAML reads `1e-4` as the string "1e-4"; a float field must accept it.
    config = load_config(write(tmp_path, "optim:\n  lr: 1e-4\n  eps: 1e-6\n"))
    assert config.optim.lr == 1e-4 and config.optim.eps == 1e-6


def test_unknown_key_names_dotted_path_and_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"'optim\.learning_rat'.*Did you mean 'lr'|'optim\.learning_rat'"):
        load_config(write(tmp_path, "optim:\n  learning_rat: 0.1\n"))
    with pytest.raises(ConfigError, match=r"'model\.hidden_sise'.*Did you mean 'hidden_size'"):
        load_config(write(tmp_path, "model:\n  hidden_sise: 64\n"))
    with pytest.raises(ConfigError, match=r"'optimizer'.*Did you mean 'optim'"):
        load_config(write(tmp_path, "optimizer:\n  lr: 0.1\n"))


def test_wrong_type_names_key_value_and_type(tmp_path):
    with pytest.raises(ConfigError, match=r"'train\.batch_size': 'many' is not a valid int"):
        load_config(write(tmp_path, "train:\n  batch_size: many\n"))
    with pytest.raises(ConfigError, match=r"'model\.hidden_size': 12\.5 is not a valid int"):
        load_config(write(tmp_path, "model:\n  hidden_size: 12.5\n"))
    with pytest.raises(ConfigError, match=r"'data\.objective': 'nps' is not one of .*Did you mean 'nsp'"):
        load_config(write(tmp_path, "data:\n  objective: nps\n"))
    with pytest.raises(ConfigError, match=r"'model\.gradient_checkpointing': 3 is not a valid bool"):
        load_config(write(tmp_path, "model:\n  gradient_checkpointing: 3\n"))


def test_duplicate_yaml_keys_are_errors(tmp_path):
    path = write(tmp_path, "optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'lr' at line 3 \(first at line 2\)"):
        load_config(path)


def test_bad_overrides(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["optim.lr"])
    with pytest.raises(ConfigError, match=r"'optim\.lrr'.*Did you mean 'lr'"):
        load_config(None, ["optim.lrr=0.1"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["optim.lr.x=0.1"])


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="divisible by model.num_attention_heads"):
        load_config(None, ["model.hidden_size=100", "model.num_attention_heads=3"])
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        load_config(None, ["data.max_seq_length=1024"])
    # Zero sizes were a ZeroDivisionError in the divisibility checks, not a config error.
    with pytest.raises(ConfigError, match="model.num_attention_heads must be at least 1, got 0"):
        load_config(None, ["model.num_attention_heads=0"])
    with pytest.raises(ConfigError, match="model.num_hidden_groups must be at least 1"):
        load_config(None, ["model.type=albert", "model.num_hidden_groups=0"])


def test_resolved_config_round_trips_through_yaml(tmp_path):
    config = load_config("tiny_albert", ["optim.lr=2e-3"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(config))
    assert load_config(path) == config


def test_shipped_name_resolves_without_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    for name in ("albert_base", "albert_base.yaml"):
        path = resolve_config_path(name)
        assert path.name == "albert_base.yaml" and path.is_file()
    assert load_config("albert_base.yaml").model.type == "albert"
    with pytest.raises(ConfigError, match="Did you mean 'albert_base'"):
        resolve_config_path("albert_bsae")


def test_a_local_file_wins_over_a_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("albert_base.yaml").write_text("model:\n  hidden_size: 64\n  num_attention_heads: 4\n")
    assert load_config("albert_base.yaml").model.hidden_size == 64


def test_recipe_sources_are_typed(tmp_path):
    path = write(tmp_path, """
        prepare:
          sources:
            - path: corpus/*.txt
            - {path: dump.jsonl.zst, text_field: body}
          num_shards: 4
        tokenizer:
          kind: unigram
          vocab_size: 8000
    """)
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    assert [s.path for s in recipe.prepare.sources] == ["corpus/*.txt", "dump.jsonl.zst"]
    assert recipe.prepare.sources[1].text_field == "body"
    with pytest.raises(ConfigError, match=r"'prepare\.sources\[0\]\.text_feild'.*Did you mean 'text_field'"):
        load_recipe(write(tmp_path, "prepare:\n  sources:\n    - {path: a.txt, text_feild: t}\n", "r.yaml"))


def test_reference_documents_every_key():
    text = config_reference_markdown()
    for key in ("`optim.lr`", "`data.objective`", "`train.requeue_exit_code`", "`prepare.sources`", "`text_field`"):
        assert key in text
    assert "|  |" not in text.replace("| `", "")  # every key has a description


def test_cli_errors_are_one_paragraph_with_exit_codes(run_cli, tmp_path):
    bad = write(tmp_path, "optim:\n  lrr: 1\n")
    code, out, err = run_cli("config", "show", str(bad))
    assert code == 2
    assert "Unknown config key 'optim.lrr'" in err and "Traceback" not in err + out
    code, out, err = run_cli("config", "show", "tiny_bert", "--set", "optim.lr=5e-4")
    assert code == 0 and "lr: 0.0005" in out
    code, out, err = run_cli("config", "show", "tiny_bert", "--explain")
    assert code == 0 and "Peak learning rate" in out
    code, out, err = run_cli("config", "shw")
    assert code == 2


def test_debug_flag_shows_the_traceback(tmp_path):
    bad = write(tmp_path, "optim:\n  lrr: 1\n")
    env = dict(os.environ, BERTRAIN_DEBUG="")
    plain = subprocess.run([sys.executable, "-m", "bertrain", "config", "show", str(bad)],
                           capture_output=True, text=True, env=env)
    debug = subprocess.run([sys.executable, "-m", "bertrain", "--debug", "config", "show", str(bad)],
                           capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr


def test_yaml_no_and_off_mean_the_spelled_choices(tmp_path):
    # YAML 1.1 reads bare `no` / `off` as False; Literal fields with such a choice take it back.
    config = load_config(write(tmp_path, "train:\n  mixed_precision: no\nlogging:\n  wandb: off\n"))
    assert config.train.mixed_precision == "no" and config.logging.wandb == "off"
    assert load_config(None, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="'data.objective'"):
        load_config(None, ["data.objective=no"])

"""The config system: typed loading, errors that name the key, overrides, shipped-name lookup."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from bertrain.config import (Config, ConfigWarning, ModelConfig, Recipe, check_precision_for_device,
                             config_reference_markdown, dump_yaml, load_config, load_recipe, micro_batch_size_for,
                             resolve_config_path, validate_model)
from bertrain.errors import ConfigError
from tests.helpers import config_help, squeezed


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
    config = load_config(path, ["optim.lr=3e-4", "train.max_steps=null", "train.max_tokens=1000", "model.type=albert"])
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
    with pytest.raises(ConfigError, match=r"'optim\.learning_rat'.*Did you mean 'optim\.lr'"):
        load_config(write(tmp_path, "optim:\n  learning_rat: 0.1\n"))
    with pytest.raises(ConfigError, match=r"'model\.hidden_sise'.*Did you mean 'model\.hidden_size'"):
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


def test_num_workers_is_auto_or_a_count(tmp_path):
    assert load_config(write(tmp_path, "data:\n  path: d\n")).data.num_workers == "auto"
    assert load_config(write(tmp_path, "data:\n  path: d\n  num_workers: 3\n")).data.num_workers == 3
    for bad, why in (("many", "not"), ("-1", "0 or more, or auto")):
        with pytest.raises(ConfigError, match=rf"data\.num_workers.*{why}"):
            load_config(write(tmp_path, f"data:\n  path: d\n  num_workers: {bad}\n"))


def test_duplicate_yaml_keys_are_errors(tmp_path):
    path = write(tmp_path, "optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'lr' at line 3 \(first at line 2\)"):
        load_config(path)


def test_bad_overrides(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["optim.lr"])
    with pytest.raises(ConfigError, match=r"'optim\.lrr'.*Did you mean 'optim\.lr'"):
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


def test_run_budget_and_intervals_are_checked_at_load():
    with pytest.raises(ConfigError, match="Set a budget: train.max_steps or train.max_tokens"):
        load_config(None, ["train.max_steps=null"])
    assert load_config(None, ["train.max_steps=null", "train.max_tokens=5000"]).train.max_tokens == 5000
    for key in ("save_every", "log_every"):
        with pytest.raises(ConfigError, match=rf"'train\.{key}' must be at least 1"):
            load_config(None, [f"train.{key}=0"])


def test_validate_model_checks_a_bare_model_section():
    validate_model(ModelConfig(hidden_size=64, num_attention_heads=4))
    with pytest.raises(ConfigError, match=r"model.hidden_size \(64\) must be divisible by model.num_attention_heads \(5\)"):
        validate_model(ModelConfig(hidden_size=64, num_attention_heads=5))
    with pytest.raises(ConfigError, match="num_hidden_layers must be divisible by model.num_hidden_groups"):
        validate_model(ModelConfig(type="albert", num_hidden_layers=5, num_hidden_groups=2))
    validate_model(ModelConfig(type="bert", num_hidden_layers=5, num_hidden_groups=2))  # groups are ALBERT's
    with pytest.raises(ConfigError, match="model.vocab_size must be at least 1, got 0"):
        validate_model(ModelConfig(vocab_size=0))


def test_micro_batch_size_divides_the_global_batch():
    config = load_config(None, ["train.batch_size=24", "train.gradient_accumulation_steps=3"])
    assert [micro_batch_size_for(config, world) for world in (1, 2, 4)] == [8, 4, 2]
    with pytest.raises(ConfigError, match=r"3 x 3 = 9"):
        micro_batch_size_for(config, 3)


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
    with pytest.raises(ConfigError, match=r"'prepare\.sources\[0\]\.text_feild'.*"
                                          r"Did you mean 'prepare\.sources\[0\]\.text_field'"):
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
    assert code == 0 and squeezed(config_help("optim.lr")) in squeezed(out)
    code, out, err = run_cli("config", "shw")
    assert code == 2


def test_debug_flag_shows_the_traceback(tmp_path):
    bad = write(tmp_path, "optim:\n  lrr: 1\n")
    env = dict(os.environ, BERTRAIN_DEBUG="")
    plain = subprocess.run([sys.executable, "-m", "bertrain", "config", "show", str(bad)],
                           capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    # Before the command or after it (where users put it; it was "No such option: --debug"), or from the
    # environment: the traceback, and the same exit code (it was 1, so a job script read a bad config as a failure).
    show = ["config", "show", str(bad)]
    for args, debug_env in ((["--debug", *show], ""), ([*show, "--debug"], ""), (show, "1"),
                            (["--debug", *show, "--debug"], "")):  # twice: it was "No such option" again
        debug = subprocess.run([sys.executable, "-m", "bertrain", *args], capture_output=True, text=True,
                               env=dict(env, BERTRAIN_DEBUG=debug_env))
        assert debug.returncode == 2 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr, args
        assert "'optim.lrr'" in debug.stderr  # the one-paragraph message too


def test_yaml_no_and_off_mean_the_spelled_choices(tmp_path):
    # YAML 1.1 reads bare `no` / `off` as False; Literal fields with such a choice take it back.
    config = load_config(write(tmp_path, "train:\n  mixed_precision: no\nlogging:\n  wandb: off\n"))
    assert config.train.mixed_precision == "no" and config.logging.wandb == "off"
    assert load_config(None, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="'data.objective'"):
        load_config(None, ["data.objective=no"])


# ----------------------------------------------------------------------------------------------
# Issue 15.6: every bad value refused naming the key, the nearest key suggested, warnings with figures
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("written,meant", [
    ("optim.learning_rate", "optim.lr"),          # another toolkit's name (an alias in the schema)
    ("optim.lrr", "optim.lr"),                    # a typo
    ("train.lr", "optim.lr"),                     # the right key in the wrong section
    ("train.warmup_steps", "optim.warmup_steps"),
    ("train.seq_len", "data.max_seq_length"),
    ("model.dropout", "model.hidden_dropout_prob"),
    ("optimizer.lr", "optim"),
])
def test_unknown_key_suggests_the_nearest_valid_key_in_yaml_and_set(tmp_path, written, meant):
    expected = rf"Unknown config key '{re.escape(written.split('.')[0] if meant == 'optim' else written)}'.*" \
               rf"Did you mean '{re.escape(meant)}'\?"
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [f"{written}=1"])
    section, key = written.split(".")
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, f"{section}:\n  {key}: 1\n"))


def test_an_unknown_key_with_nothing_close_lists_the_section(tmp_path):
    with pytest.raises(ConfigError, match=r"'data\.zzz'.*Valid keys here: data\.path, data\.objective"):
        load_config(None, ["data.zzz=1"])


@pytest.mark.parametrize("override,key", [
    ("train.max_steps=0", "train.max_steps"), ("train.max_steps=-5", "train.max_steps"),
    ("train.max_tokens=0", "train.max_tokens"),
    ("optim.lr=-1e-3", "optim.lr"), ("optim.lr=0", "optim.lr"),
    ("model.hidden_dropout_prob=1.5", "model.hidden_dropout_prob"),
    ("model.hidden_dropout_prob=1", "model.hidden_dropout_prob"),
    ("model.attention_probs_dropout_prob=-0.1", "model.attention_probs_dropout_prob"),
    ("optim.betas=[0.9, 1.5]", "optim.betas[1]"), ("optim.eps=0", "optim.eps"),
    ("optim.weight_decay=-0.01", "optim.weight_decay"), ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm"),
    ("data.short_seq_prob=1.2", "data.short_seq_prob"), ("data.mask_prob=-0.2", "data.mask_prob"),
    ("data.ngram_max=0", "data.ngram_max"), ("data.num_workers=-1", "data.num_workers"),
    ("train.keep_last=0", "train.keep_last"), ("train.eval_every=-1", "train.eval_every"),
    ("train.requeue_exit_code=0", "train.requeue_exit_code"), ("train.stop_at_step=0", "train.stop_at_step"),
])
def test_values_out_of_range_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"Config key '{re.escape(key)}' must be"):
        load_config(None, [override])


def test_boundary_values_that_make_sense_are_accepted():
    config = load_config(None, ["model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0",
                                "optim.warmup_steps=0", "optim.max_grad_norm=null", "train.eval_every=0",
                                "train.max_steps=1", "optim.weight_decay=0", "data.short_seq_prob=1"])
    assert config.train.max_steps == 1 and config.model.hidden_dropout_prob == 0


def test_warmup_longer_than_the_run_warns_with_the_figures():
    with pytest.warns(ConfigWarning, match=r"optim\.warmup_steps \(50\) is longer than the run "
                                           r"\(train\.max_steps 10\).*ends at 0\.0002"):
        load_config(None, ["train.max_steps=10", "optim.warmup_steps=50", "optim.lr=1e-3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load_config(None, ["train.max_steps=10", "optim.warmup_steps=10"])  # exactly the run: fine
        load_config(None, ["train.max_steps=10", "optim.warmup_fraction=0.1"])  # the fraction wins
        load_config(None, ["train.max_steps=null", "train.max_tokens=100"])  # steps unknown before the data
        for name in ("tiny_bert", "tiny_albert", "demo_bert", "demo_albert", "bert_base", "albert_base"):
            load_config(name)


def test_fp16_is_refused_on_a_cpu_only():
    with pytest.raises(ConfigError, match=r"'train\.mixed_precision' is 'fp16', but this run is on the CPU"):
        check_precision_for_device("fp16", "cpu")
    for precision, device in (("fp16", "cuda"), ("bf16", "cpu"), ("auto", "cpu"), ("no", "cpu")):
        check_precision_for_device(precision, device)


def test_mixed_precision_auto_is_the_default_and_tf32_is_on():
    config = Config()
    assert config.train.mixed_precision == "auto" and config.train.tf32 is True
    assert load_config(None, ["train.mixed_precision=bf16", "train.tf32=false"]).train.tf32 is False
    with pytest.raises(ConfigError, match=r"'train\.mixed_precision': 'fp32' is not one of 'auto', 'no'"):
        load_config(None, ["train.mixed_precision=fp32"])
    reference = config_reference_markdown()
    for key in ("train.mixed_precision", "train.tf32"):
        assert f"`{key}`" in reference and config_help(key) in reference


# ----------------------------------------------------------------------------------------------
# Issue 26.6: list entries by index in --set; sources readable in `config show --explain`
# ----------------------------------------------------------------------------------------------


def test_set_names_a_list_entry_by_its_index(tmp_path):
    path = write(tmp_path, """
        prepare:
          sources:
            - {path: a.txt, text_layout: paragraphs}
            - {path: verses.jsonl}
    """)
    recipe = load_recipe(path, ["prepare.sources.1.group_by=[book, chapter]", "prepare.sources[1].text_field=body"])
    first, second = recipe.prepare.sources
    assert (second.group_by, second.text_field, second.path) == (["book", "chapter"], "body", "verses.jsonl")
    assert (first.path, first.text_layout, first.group_by) == ("a.txt", "paragraphs", None)  # untouched
    assert load_config(None, ["optim.betas.1=0.98"]).optim.betas == [0.9, 0.98]  # from the default list


@pytest.mark.parametrize("override,message", [
    ("prepare.sources.2.group_by=x", r"'prepare\.sources' has 2 entries \(indexes 0 to 1\), so index 2 is out"),
    ("prepare.sources.group_by=x", r"'prepare\.sources' is a list \(indexes 0 to 1\): name an entry by its index, "
                                   r"e\.g\. prepare\.sources\.0\.group_by="),
    ("prepare.sources.0.groupby=x", r"Unknown config key 'prepare\.sources\.0\.groupby'.*"
                                    r"Did you mean 'prepare\.sources\.0\.group_by'"),
    ("prepare.group_by=x", r"Did you mean 'prepare\.sources\.0\.group_by'"),
    ("prepare.sources.0.path.x=1", r"'prepare\.sources\.0\.path' is a value, not a section"),
    # It suggested "e.g. prepare.sources.0.-1=...".
    ("prepare.sources.-1.group_by=x", r"indexes count from 0, not from the end: the last entry is "
                                      r"prepare\.sources\.1\."),
])
def test_bad_indexed_keys_name_the_valid_range_or_key(tmp_path, override, message):
    path = write(tmp_path, "prepare:\n  sources:\n    - {path: a.jsonl}\n    - {path: b.jsonl}\n")
    with pytest.raises(ConfigError, match=message):
        load_recipe(path, [override])


@pytest.mark.parametrize("index", ["0", "-1"])
def test_an_empty_list_says_so(tmp_path, index):
    with pytest.raises(ConfigError, match=rf"'prepare\.sources' has 0 entries \(it is empty\), so index {index} is "
                                          r"out of range.*--set 'prepare\.sources=\[\.\.\.\]'"):
        load_recipe(None, [f"prepare.sources.{index}.group_by=title"])


def test_explain_shows_each_source_key_by_its_set_name(run_cli, tmp_path):
    path = write(tmp_path, "prepare:\n  sources:\n    - {path: a.txt}\n    - {path: b.jsonl, group_by: [book, ch]}\n")
    code, out, err = run_cli("config", "show", str(path), "--explain")
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["prepare.sources.0.path"] == "'a.txt'" and rows["prepare.sources.1.path"] == "'b.jsonl'"
    assert rows["prepare.sources.1.group_by"] == "['book', 'ch']" and rows["prepare.sources.0.group_by"] == "None"
    assert "SourceConfig(" not in out
    assert "[book,chapter]" in squeezed(out)  # the help's example, not swallowed as console markup


def test_a_folder_named_like_a_shipped_config_does_not_hide_it(tmp_path, monkeypatch):
    """`prepare --recipe pydoc` in a directory that holds a `pydoc/` folder read the folder as the config file."""
    from bertrain.config import load_recipe, shipped_dir, to_dict

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pydoc").mkdir()
    (tmp_path / "tiny_bert").mkdir()
    shipped_recipe = load_recipe(shipped_dir("data_recipes") / "pydoc.yaml")
    assert to_dict(load_recipe("pydoc")) == to_dict(shipped_recipe)
    assert to_dict(load_config("tiny_bert")) == to_dict(load_config(shipped_dir("configs") / "tiny_bert.yaml"))
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigError, match="'mine' is a directory, not a YAML file"):
        load_config("mine")


@pytest.mark.parametrize("typed", ["0123", "007", "1.50", "1_000", "12:30", "runs/exp #3", "no", "2024-01-05", "None"])
def test_a_string_key_keeps_its_override_as_typed(typed):
    # YAML read them as 83, 7, 1.5, 1000, 750 (base 60), "runs/exp", False, a date and "None": a path or a run name
    # silently changed, or a refusal ("False is not a valid str | null").
    config = load_config("tiny_bert", [f"train.output_dir={typed}", f"logging.wandb_run_name={typed}"])
    assert config.train.output_dir == typed and config.logging.wandb_run_name == typed


def test_norwegian_is_a_language_not_false():
    assert load_recipe("pydoc", ["prepare.sentence_language=no"]).prepare.sentence_language == "no"


def test_string_overrides_still_read_null_and_quotes_and_other_keys_read_yaml():
    config = load_config("tiny_bert", ["logging.wandb_run_name=null", 'data.path="a #b"', "optim.lr=3e-4",
                                       "optim.betas=[0.9, 0.98]", "model.init_from=~"])
    assert config.logging.wandb_run_name is None and config.model.init_from is None
    assert config.data.path == "a #b" and config.optim.lr == 3e-4 and config.optim.betas == [0.9, 0.98]


def test_a_section_override_sets_its_keys_and_keeps_the_file_s_others():
    shipped = load_config("tiny_bert")
    config = load_config("tiny_bert", ["optim={lr: 3e-4}"])
    # It replaced the section: tiny_bert's warmup_steps 50 became the default 10000.
    assert config.optim.lr == 3e-4 and config.optim.warmup_steps == shipped.optim.warmup_steps != 10000
    source = load_recipe("pydoc", ["prepare.sources.0={max_documents: 5}"]).prepare.sources[0]  # a list entry too
    assert source.max_documents == 5 and source.path == "pydoc_data.topics"


@pytest.mark.parametrize("override, key", [
    ("optim.lr=inf", "optim.lr"), ("optim.eps=.inf", "optim.eps"), ("train.seed=-1", "train.seed"),
    ("train.seed=1e20", "train.seed"), ("model.type_vocab_size=1", "model.type_vocab_size")])
def test_values_that_failed_later_are_refused_naming_the_key(override, key):
    # lr=inf trained (a dry run estimated it); the seeds and one token type failed at the first batch, exit 1.
    with pytest.raises(ConfigError, match=re.escape(f"Config key '{key}' must be")):
        load_config("tiny_bert", [override])


@pytest.mark.parametrize("override, key", [
    ("prepare.max_line_chars=0", "prepare.max_line_chars"), ("prepare.sources.0.max_documents=0",
                                                             "prepare.sources.0.max_documents"),
    ("tokenizer.min_frequency=-1", "tokenizer.min_frequency"), ("tokenizer.max_bytes=0", "tokenizer.max_bytes")])
def test_recipe_values_that_failed_while_preparing_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(f"Config key '{key}' must be")):
        load_recipe("pydoc", [override])


def test_a_config_file_that_is_not_utf8_names_the_line(tmp_path, run_cli):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"optim:\n  lr: 2e-4  # caf\xe9\n")
    code, out, err = run_cli("config", "show", str(path))
    said = " ".join(err.split())
    # It was "Error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 ...", exit 1.
    assert code == 2 and f"{path}, line 2: byte 0xe9 is not UTF-8" in said and "Traceback" not in err, said


def test_python_s_none_for_a_nullable_number_says_how_yaml_writes_it():
    with pytest.raises(ConfigError, match=re.escape("'None' is not a valid int | null (YAML's none is null or ~).")):
        load_config("tiny_bert", ["train.max_tokens=None"])


def test_config_show_suggests_the_nearest_config_or_recipe(run_cli):
    # It looked in the recipes only: "tiny_bret" got a list of recipes and no suggestion.
    code, _, err = run_cli("config", "show", "tiny_bret")
    assert code == 2 and "Did you mean 'tiny_bert'?" in " ".join(err.split())
    code, _, err = run_cli("config", "show", "pydok")
    assert code == 2 and "Did you mean 'pydoc'?" in " ".join(err.split())


@pytest.mark.parametrize("typed, meant", [("data.mlm_prob", "data.mlm_probability"), ("optim.LR", "optim.lr"),
                                          ("train.batch", "train.batch_size")])
def test_a_key_s_start_or_other_case_suggests_that_key(typed, meant):
    # `data.mlm_prob` suggested data.mask_prob, the 80% [MASK] share: following it changed the wrong setting.
    with pytest.raises(ConfigError, match=re.escape(f"Did you mean '{meant}'?")):
        load_config("tiny_bert", [f"{typed}=1"])


@pytest.mark.parametrize("typed, meant", [("data.objective=NSP", "nsp"), ("model.hidden_act=GELU", "gelu")])
def test_a_choice_in_another_case_suggests_the_choice(typed, meant):
    with pytest.raises(ConfigError, match=re.escape(f"Did you mean '{meant}'?")):  # difflib saw no match for NSP
        load_config("tiny_bert", [typed])


def test_an_empty_section_reads_as_no_keys(tmp_path):
    # `model:` with its keys commented out is YAML's null: "must be a mapping of ModelConfig keys, not None".
    path = write(tmp_path, "model:\n  # hidden_size: 128\ntrain:\n  max_steps: 7\n")
    config = load_config(path, ["model.num_hidden_layers=3", "optim.warmup_steps=1"])
    assert config.model.num_hidden_layers == 3 and config.model.hidden_size == ModelConfig().hidden_size
    assert config.train.max_steps == 7


def test_yaml_merge_keys_share_settings_and_explicit_keys_win(tmp_path):
    # The duplicate-key loader refused `<<: *anchor` ("could not determine a constructor for the tag ...merge").
    path = write(tmp_path, """
        prepare:
          sources:
            - &shared {path: a.txt, format: text, max_documents: 5}
            - <<: *shared
              path: b.txt
        """)
    first, second = load_recipe(path).prepare.sources
    assert (second.path, second.format, second.max_documents) == ("b.txt", "text", 5) and first.path == "a.txt"
    with pytest.raises(ConfigError, match="duplicate key 'path'"):  # a key given twice beside the merge still is
        load_recipe(write(tmp_path, "prepare:\n  sources:\n    - {path: a.txt, path: b.txt}\n", "d.yaml"))


def test_an_empty_run_directory_is_refused():
    # It wrote checkpoints, metrics.jsonl and the config into whatever the current directory was.
    with pytest.raises(ConfigError, match=re.escape("Config key 'train.output_dir' must be a directory")):
        load_config("tiny_bert", ["train.output_dir="])
    assert load_config("tiny_bert", ["train.output_dir=."]).train.output_dir == "."

"""What ships with bertrain is consistent with the code: configs, recipes, docs, --help, README."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from bertrain.config import (Config, config_reference_markdown, describe_yaml, load_config, load_recipe,
                             read_yaml, set_dotted, shipped_dir)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(shipped_dir("configs").glob("*.yaml"))
RECIPES = sorted(shipped_dir("data_recipes").glob("*.yaml"))

# Parameter counts of the pretraining models as published (BERT paper; ALBERT paper, Table 1),
# with the papers' vocabularies: 30522 WordPieces for BERT, 30000 SentencePieces for ALBERT.
PUBLISHED_PARAMETERS = {"bert_base": 110e6, "bert_large": 340e6, "albert_base": 12e6, "albert_large": 18e6,
                        "bert_base_zh_wwm": 110e6}


def test_something_ships():
    names = {p.stem for p in CONFIGS}
    assert {"bert_base", "bert_large", "bert_base_phase2", "bert_large_phase2", "albert_base", "albert_large",
            "tiny_albert", "tiny_bert", "demo_albert", "demo_bert", "bert_base_zh_wwm", "bert_base_zh_wwm_phase2"} <= names
    assert {"wikipedia_en", "gutenberg_en", "c4_de", "local_text", "local_jsonl", "wikipedia_zh",
            "multilingual_local"} <= {p.stem for p in RECIPES}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_loads_and_validates(path):
    assert "prepare" not in read_yaml(path), "a recipe in configs/"
    config = load_config(path.stem)  # by shipped name, as users call it
    assert config == load_config(path)
    assert config.data.path, "a shipped config names the prepared data it expects"
    assert config.model.vocab_size is None, "vocab_size comes from the prepared data's manifest"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_picks_precision_per_device(path):
    # bf16 hard-coded was ~12x slower per step on a CPU without native bf16; `auto` decides per device.
    config = load_config(path)
    assert config.train.mixed_precision == "auto" and config.train.tf32 is True


@pytest.mark.parametrize("path", CONFIGS + RECIPES, ids=lambda p: p.stem)
def test_shipped_yaml_opens_with_a_one_line_description(path):
    description = describe_yaml(path)  # what `bertrain config list` shows
    assert 20 <= len(description) <= 250 and description.endswith("."), description


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipe_loads_and_validates(path):
    assert set(read_yaml(path)) <= {"prepare", "tokenizer"}
    recipe = load_recipe(path.stem)
    assert recipe == load_recipe(path)
    assert recipe.prepare.sources, "a recipe names at least one source"
    for source in recipe.prepare.sources:
        assert source.path
        if source.format == "hub":
            assert "/" in source.path, "hub datasets are named owner/name"
    assert recipe.tokenizer.path is None, "shipped recipes train their tokenizer"


def test_configs_name_recipes_whose_tokenizer_fits_the_model():
    recipes = {p.stem: load_recipe(p) for p in RECIPES}
    checked = 0
    for path in CONFIGS:
        config = load_config(path)
        recipe = recipes.get(Path(config.data.path).name)
        if recipe is None:
            continue
        checked += 1
        # ALBERT's n-gram masking and BERT's whole-word masking find words via the tokenizer's marker;
        # the papers pair ALBERT with SentencePiece and BERT with WordPiece.
        expected = "unigram" if config.model.type == "albert" else "wordpiece"
        assert recipe.tokenizer.kind == expected, f"{path.stem} trains on {config.data.path}"
    assert checked >= 4


@pytest.mark.parametrize("phase1,phase2", [("bert_base", "bert_base_phase2"), ("bert_large", "bert_large_phase2"),
                                           ("bert_base_zh_wwm", "bert_base_zh_wwm_phase2")])
def test_phase2_continues_phase1(phase1, phase2):
    first, second = load_config(phase1), load_config(phase2)
    assert (first.data.max_seq_length, second.data.max_seq_length) == (128, 512)
    assert second.data.path == first.data.path
    same_shape = {f.name for f in dataclasses.fields(first.model)} - {"init_from", "gradient_checkpointing"}
    for name in same_shape:
        assert getattr(first.model, name) == getattr(second.model, name), f"model.{name}"
    # init_from points into phase 1's run directory, at a checkpoint of its last step.
    assert second.model.init_from.startswith(first.train.output_dir + "/checkpoints/step-")
    assert int(second.model.init_from.rsplit("-", 1)[1]) == first.train.max_steps
    assert second.train.output_dir != first.train.output_dir


def _build_on_meta(config: Config, vocab_size: int):
    torch = pytest.importorskip("torch")
    model_module = pytest.importorskip("bertrain.model")
    model_config = dataclasses.replace(config.model, vocab_size=vocab_size, init_from=None)
    with torch.device("meta"):  # shapes only: BERT-large would otherwise allocate 1.3 GB
        return model_module.build_model(model_config)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_builds_its_model(path):
    config = load_config(path)
    vocab_size = 30000 if config.model.type == "albert" else 30522
    model = _build_on_meta(config, vocab_size)
    parameters = {id(p): p.numel() for p in model.parameters()}  # tied weights counted once
    total = sum(parameters.values())
    published = PUBLISHED_PARAMETERS.get(path.stem.removesuffix("_phase2"))
    if published is not None:
        assert abs(total - published) / published < 0.06, f"{path.stem}: {total / 1e6:.1f}M parameters"
    # Embedding table sized by the vocabulary we passed, not by the config.
    assert any(p.shape[0] == vocab_size for p in model.parameters() if p.dim() == 2)


# ----------------------------------------------------------------------------------------------
# Docs, --help and README
# ----------------------------------------------------------------------------------------------


def test_config_reference_is_up_to_date():
    path = ROOT / "docs" / "config.md"
    assert path.is_file(), "generate it: bertrain config reference --out docs/config.md"
    assert path.read_text() == config_reference_markdown(), (
        "docs/config.md is out of date: run `bertrain config reference --out docs/config.md`")


def _commands():
    """{'prepare': click.Command, 'config show': click.Command, ...} of the whole CLI."""
    import typer

    from bertrain.cli import _command_modules
    from bertrain.cli.app import app

    _command_modules()
    root = typer.main.get_command(app)
    found = {}

    def walk(group, prefix):
        for name, command in group.commands.items():
            found[f"{prefix}{name}"] = command
            if hasattr(command, "commands"):  # a group (typer's classes are not click's subclasses)
                walk(command, f"{prefix}{name} ")

    walk(root, "")
    return found


EXPECTED_COMMANDS = {"prepare", "pretrain", "export", "fill-mask", "demo", "config show", "config list",
                     "config reference"}


def test_help_lists_every_command(run_cli):
    commands = _commands()
    assert EXPECTED_COMMANDS | {"config"} <= set(commands), f"missing: {EXPECTED_COMMANDS - set(commands)}"
    code, out, _ = run_cli("--help")
    assert code == 0
    for name in commands:
        if " " not in name:
            assert re.search(rf"\b{re.escape(name)}\b", out), f"`bertrain --help` does not list {name}"


@pytest.mark.parametrize("name", sorted(EXPECTED_COMMANDS))
def test_every_command_help_has_an_example(run_cli, name):
    code, out, err = run_cli(*name.split(), "--help")
    assert code == 0, err
    assert "Example" in out, f"`bertrain {name} --help` has no Example"


def test_every_registered_command_help_has_an_example(run_cli):
    for name, command in _commands().items():
        if hasattr(command, "commands"):
            continue  # a group's --help lists its commands, each with its own example
        code, out, err = run_cli(*name.split(), "--help")
        assert code == 0, (name, err)
        assert "Example" in out, f"`bertrain {name} --help` has no Example"


def _split_launch(tokens: list[str]) -> list[list[str]]:
    """`launch [--nproc N] REST`: launch's own options, and REST as a bertrain command with --nproc (without it,
    REST is a launcher's command line whose `-m bertrain …` the scan finds by itself)."""
    if tokens[:1] != ["launch"]:
        return [tokens]
    if tokens[1:2] == ["--nproc"]:
        return [tokens[:3], tokens[3:]]
    return [tokens[:1]]


def _readme_bertrain_invocations() -> list[list[str]]:
    """Every `bertrain ...` / `python -m bertrain ...` command line in the README's shell blocks."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S)
    invocations = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            for part in re.split(r"&&|\|\||;", line):
                tokens = shlex.split(part)
                for i, token in enumerate(tokens):
                    if token == "bertrain" and (i == 0 or tokens[i - 1] in ("-m", "run", "docker")
                                                or tokens[i - 1].startswith("-")):
                        if i > 0 and tokens[i - 1] == "-t":
                            continue  # docker build -t bertrain
                        invocations += _split_launch(tokens[i + 1:])
                    elif token.endswith("/bertrain") and i == 0:
                        invocations.append(tokens[i + 1:])
    return invocations


def test_readme_shows_only_commands_and_options_that_exist():
    commands = _commands()
    invocations = _readme_bertrain_invocations()
    assert len(invocations) >= 8
    seen = set()
    for tokens in invocations:
        words = [t for t in tokens if not t.startswith("-")]
        if not words:
            continue
        name = words[0]
        if len(words) > 1 and f"{words[0]} {words[1]}" in commands:
            name = f"{words[0]} {words[1]}"
        assert name in commands, f"README runs `bertrain {' '.join(tokens)}`: no command '{name}'"
        seen.add(name)
        command = commands[name]
        options = {opt for param in command.params if param.param_type_name == "option"
                   for opt in param.opts + param.secondary_opts} | {"--help"}
        for token in tokens:
            if token.startswith("--"):
                assert token.split("=", 1)[0] in options, f"README: `bertrain {name}` has no option {token}"
    assert {"prepare", "pretrain", "export", "fill-mask", "demo"} <= seen


def test_readme_set_overrides_name_real_keys():
    text = "".join(re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", (ROOT / "README.md").read_text(), re.S))
    overrides = re.findall(r"--set\s+([a-z_]+\.[a-z_.]+)=", text)
    assert overrides
    for key in overrides:
        set_dotted({}, key, 1, Config)  # raises ConfigError for an unknown key


def test_readme_names_shipped_configs_and_recipes():
    text = (ROOT / "README.md").read_text()
    for match in re.findall(r"--config\s+(\w+)", text):
        assert match in {p.stem for p in CONFIGS}, f"README uses --config {match}: not shipped"
    for match in re.findall(r"--recipe\s+(\w+)", text):
        assert match in {p.stem for p in RECIPES}, f"README uses --recipe {match}: not shipped"
    # The install-and-test one-liner is the one CI runs.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pip install -q torch==2.13.0" in ci and 'python3 -m pip install -q -e ".[dev]"' in ci
    test_command = re.search(r'python3 -m pip install torch==2\.13\.0 && python3 -m pip install -e "\.\[dev\]" && '
                             r'(python3 -m pytest[^\n]*)\n', text)
    assert test_command and f"\n{test_command[1]}\n" in ci, "CI runs the README's test command"
    slow = test_command[1].replace('-m "not slow"', "-m slow")
    assert slow != test_command[1] and f"\n{slow}\n" in ci, "CI runs the slow tests the README's command leaves out"
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)\)", text):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"



# ----------------------------------------------------------------------------------------------
# The local recipes work as shipped: run from a directory holding their default `corpus/`
# ----------------------------------------------------------------------------------------------


def _documents(pydoc_text: str, count: int) -> list[str]:
    paragraphs = [p for p in pydoc_text.split("\n\n") if len(p.split()) > 20]
    return ["\n\n".join(paragraphs[i::count][:6]) for i in range(count)]


@pytest.mark.parametrize("name", ["local_text", "local_jsonl"])
def test_local_recipe_prepares_its_default_corpus(name, tmp_path, monkeypatch, pydoc_text):
    import json

    import zstandard

    from bertrain.data.format import open_prepared
    from bertrain.data.prepare import prepare_corpus

    documents = _documents(pydoc_text, 40)
    nested = tmp_path / "corpus" / "part"
    nested.mkdir(parents=True)
    if name == "local_text":  # plain prose, one document per file, in a subdirectory (the ** glob)
        for i, text in enumerate(documents):
            (nested / f"doc{i:03d}.txt").write_text(text + "\n")
    else:  # half plain .jsonl, half compressed .jsonl.zst
        lines = [json.dumps({"text": text}) + "\n" for text in documents]
        (nested / "a.jsonl").write_text("".join(lines[:20]))
        (nested / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(lines[20:]).encode()))
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(name, ["tokenizer.vocab_size=400", "prepare.workers=1", "prepare.num_shards=2"])
    prepare_corpus(recipe, tmp_path / "data")
    prepared = open_prepared(tmp_path / "data")
    splits = prepared.manifest["splits"]
    assert splits["train"]["documents"] + splits["validation"]["documents"] == len(documents)
    assert prepared.tokenizer_kind == recipe.tokenizer.kind
    assert prepared.split("train").num_tokens > 1000

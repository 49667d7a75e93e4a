"""Loading a training config or a data recipe: file or shipped name, `--set` overrides, then validation."""

from __future__ import annotations

import typing
from pathlib import Path

from bertrain.config.schema import Config, Recipe
from bertrain.config.validate import validate
from bertrain.config.overrides import read_tree
from bertrain.config.yaml_tree import find_config_path, read_yaml, resolve_config_path


def load_config(path: str | Path | None, overrides: typing.Iterable[str] = ()) -> Config:
    """Load a training config (file or shipped name) with `section.key=value` overrides."""
    config = read_tree(Config, path, overrides, kind="configs")
    validate(config)
    return config


def load_recipe(path: str | Path | None, overrides: typing.Iterable[str] = ()) -> Recipe:
    """Load a data recipe (file or shipped name) with `section.key=value` overrides."""
    recipe = read_tree(Recipe, path, overrides, kind="data_recipes")
    validate(recipe)
    return recipe


def load_config_or_recipe(name: str | Path, overrides: typing.Iterable[str] = ()) -> tuple[Path, Config | Recipe]:
    """(its file, the config or recipe) by file or shipped name; a file with a `prepare` section is a recipe."""
    path = find_config_path(name) or resolve_config_path(name, kind="data_recipes")
    loader = load_recipe if "prepare" in read_yaml(path) else load_config
    return path, loader(path, overrides)

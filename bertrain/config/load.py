"""Loading a training config or a data recipe: file or shipped name, `--set` overrides, then validation."""

from __future__ import annotations

import typing
from pathlib import Path

from bertrain.config.schema import Config, Recipe
from bertrain.config.validate import validate
from bertrain.config.yaml_tree import read_tree


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

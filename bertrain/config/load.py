"""Loading a training config or a data recipe: file or shipped name, `--set` overrides, then validation."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path

from bertrain.config.schema import Config, Recipe
from bertrain.config.validate import validate
from bertrain.config.overrides import read_tree
from bertrain.config.yaml_tree import find_config_path, read_yaml, resolve_config_path, shipped_files


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
    shipped = {kind: [p.stem for p in shipped_files(kind)] for kind in ("configs", "data_recipes")}
    close = difflib.get_close_matches(Path(name).stem, shipped["configs"] + shipped["data_recipes"], n=1)
    nearest = "configs" if close and close[0] in shipped["configs"] else "data_recipes"  # its error suggests it
    path = find_config_path(name) or find_config_path(name, "data_recipes") or resolve_config_path(name, nearest)
    loader = load_recipe if "prepare" in read_yaml(path) else load_config
    return path, loader(path, overrides)

"""`bertrain config show` and `bertrain config reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from bertrain.cli.app import SetOption, app, console

config_app = typer.Typer(
    help="List the shipped configs and recipes, show resolved configs, print the config reference.\n\n"
         "Example: bertrain config list\n\nExample: bertrain config show albert_base --explain",
    no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def show(
    config: str = typer.Argument(..., metavar="NAME|FILE",
                                 help="Config or recipe YAML, or a shipped name (albert_base, local_text; "
                                      "`bertrain config list` shows them all)."),
    overrides: Optional[list[str]] = SetOption,
    explain: bool = typer.Option(False, "--explain", help="Also print each key's documentation."),
) -> None:
    """Print the resolved config (defaults + file + --set overrides).

    Example: bertrain config show albert_base --set optim.lr=3e-4 --explain
    """
    from bertrain.config import dump_yaml, explain_lines, load_config_or_recipe

    path, resolved = load_config_or_recipe(config, overrides or [])
    if not explain:
        typer.echo(dump_yaml(resolved), nl=False)
        return
    table = Table(title=f"{path}", show_lines=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", style="green", overflow="fold")
    table.add_column("meaning", overflow="fold")  # wrapped at word boundaries, never cut with an ellipsis
    for key, value, help_text in explain_lines(resolved):
        table.add_row(key, Text(repr(value) if isinstance(value, str) else str(value)), Text(help_text))
    console.print(table)


@config_app.command("list")
def list_shipped() -> None:
    """List the shipped configs (`pretrain --config NAME`) and data recipes (`prepare --recipe NAME`).

    Each with the first sentence of its file's opening comment; `bertrain config show NAME` prints one in full.

    Example: bertrain config list
    """
    from bertrain.config import describe_yaml, shipped_files

    for title, kind in (("Configs (bertrain pretrain --config NAME):", "configs"),
                        ("Data recipes (bertrain prepare --recipe NAME):", "data_recipes")):
        files = shipped_files(kind)
        width = max((len(path.stem) for path in files), default=0)
        console.print(title, highlight=False, markup=False)
        for path in files:
            console.print(f"  {path.stem:<{width}}  {describe_yaml(path)}", highlight=False, markup=False)
    console.print("See one in full: bertrain config show NAME (add --explain for what each key means).",
                  highlight=False, markup=False)


@config_app.command("reference")
def reference(out: Optional[Path] = typer.Option(None, "--out", help="Write to this file instead of stdout.")) -> None:
    """Print the reference of every config key, generated from the code.

    Example: bertrain config reference --out docs/config.md
    """
    from bertrain.config import config_reference_markdown
    from bertrain.files import write_atomic

    text = config_reference_markdown()
    if out:
        write_atomic(out, lambda tmp: tmp.write_text(text))  # a full disk leaves no empty or half FILE
        console.print(f"Wrote {out}")
    else:
        typer.echo(text)

"""`bertrain config show` and `bertrain config reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bertrain.cli.app import SetOption, app, console

config_app = typer.Typer(
    help="Show resolved configs and the config reference.\n\nExample: bertrain config show albert_base --explain",
    short_help="Show resolved configs and the config reference.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def show(
    config: str = typer.Argument(..., help="Config or recipe YAML, or a shipped name (albert_base, local_text)."),
    overrides: Optional[list[str]] = SetOption,
    explain: bool = typer.Option(False, "--explain", help="Also print each key's documentation."),
) -> None:
    """Print the resolved config (defaults + file + --set overrides).

    Example: bertrain config show albert_base --set optim.lr=3e-4 --explain
    """
    from bertrain.config import dump_yaml, explain_lines, load_config, load_recipe, read_yaml, resolve_config_path

    try:
        path = resolve_config_path(config)
        loader = load_config
    except Exception:
        path = resolve_config_path(config, kind="data_recipes")
        loader = load_recipe
    if "prepare" in read_yaml(path):
        loader = load_recipe
    resolved = loader(path, overrides or [])
    if not explain:
        typer.echo(dump_yaml(resolved), nl=False)
        return
    table = Table(title=f"{path}", show_lines=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", style="green")
    table.add_column("meaning")
    for key, value, help_text in explain_lines(resolved):
        table.add_row(key, repr(value) if isinstance(value, str) else str(value), help_text)
    console.print(table)


@config_app.command("reference")
def reference(out: Optional[Path] = typer.Option(None, "--out", help="Write to this file instead of stdout.")) -> None:
    """Print the reference of every config key, generated from the code.

    Example: bertrain config reference --out docs/config.md
    """
    from bertrain.config import config_reference_markdown

    text = config_reference_markdown()
    if out:
        out.write_text(text)
        console.print(f"Wrote {out}")
    else:
        typer.echo(text)

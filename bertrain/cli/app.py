"""The Typer app and the helpers every command module shares."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="bertrain",
    help="Pretrain BERT and ALBERT encoders from raw text: prepare → pretrain → export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

console = Console()
err_console = Console(stderr=True)

ConfigOption = typer.Option(None, "--config", "-c", help="Config YAML, or the name of a shipped config (albert_base).")
SetOption = typer.Option(None, "--set", "-s", help="Override a config key: --set optim.lr=3e-4 (repeatable).")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="BERTRAIN_DEBUG",
                                     help="Show full tracebacks on errors (or set BERTRAIN_DEBUG=1).")) -> None:
    """Pretrain BERT and ALBERT encoders from raw text: prepare → pretrain → export."""
    state["debug"] = debug


state: dict = {"debug": False}

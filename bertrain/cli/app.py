"""The Typer app and the options and consoles every command module shares. Help text: after a docstring's first
paragraph each paragraph is one source line (Typer keeps source line breaks) and each example fits 80 columns."""

from __future__ import annotations

import os
import warnings

import typer

from bertrain.console import make_console

app = typer.Typer(
    name="bertrain",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

console = make_console()
err_console = make_console(stderr=True)

LIST_HINT = "`bertrain config list` shows every shipped config and recipe"
ConfigOption = typer.Option(
    None, "--config", "-c", metavar="NAME|FILE",
    help=f"Config YAML, or the name of a shipped config (tiny_bert, bert_base, albert_base, …); {LIST_HINT}.")


def set_option(example: str):
    """The --set option, its help showing a key the command accepts."""
    return typer.Option(None, "--set", "-s", metavar="KEY=VALUE",
                        help=f"Override a config key: --set {example} (repeatable).")


SetOption = set_option("optim.lr=3e-4")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="BERTRAIN_DEBUG",
                                     help="Show full tracebacks on errors (or set BERTRAIN_DEBUG=1).")) -> None:
    """Pretrain BERT and ALBERT encoders from raw text: prepare → pretrain → export.

    Shipped configs and data recipes: bertrain config list. Each command's options: bertrain COMMAND --help.

    Example: bertrain prepare --recipe pydoc --out data

    Example: bertrain pretrain --config tiny_bert --data data --run-dir runs/tiny
    """
    # `debug` is read by bertrain.cli.main before parsing, so that it also covers errors while parsing.


def print_config_warnings() -> None:
    """Print ConfigWarnings as `Warning: ...` on stderr (once, rank 0), other warnings as Python does."""
    from bertrain.config import ConfigWarning

    original = warnings.showwarning
    if getattr(original, "bertrain", False):
        return

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not issubclass(category, ConfigWarning):
            original(message, category, filename, lineno, file, line)
        elif os.environ.get("RANK", "0") == "0":  # the same on every rank of a multi-process run
            err_console.print("[yellow]Warning:[/] ", end="")
            err_console.print(str(message), markup=False, highlight=False)

    show.bertrain = True  # type: ignore[attr-defined]
    warnings.showwarning = show

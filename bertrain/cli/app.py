"""The Typer app, the helpers every command module shares, and the tidying of every command's --help."""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings

import typer
from typer import rich_utils
from typer.core import TyperArgument

from bertrain.console import is_terminal, make_console

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
SetOption = typer.Option(None, "--set", "-s", metavar="KEY=VALUE",
                         help="Override a config key: --set optim.lr=3e-4 (repeatable).")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="BERTRAIN_DEBUG",
                                     help="Show full tracebacks on errors (or set BERTRAIN_DEBUG=1).")) -> None:
    """Pretrain BERT and ALBERT encoders from raw text: prepare → pretrain → export.

    Shipped configs and data recipes: bertrain config list. Each command's options: bertrain COMMAND --help.
    """
    state["debug"] = debug


state: dict = {"debug": False}


# ----------------------------------------------------------------------------------------------
# --help: typer's rich help keeps a docstring's line breaks, shows `{name}` for arguments and `<bool>`
# for flags; these fix that once for the whole command tree, whichever module defines a command.
# ----------------------------------------------------------------------------------------------


def unwrap_paragraphs(text: str) -> str:
    """Docstring text with each paragraph on one line (rich help would break sentences where the source does).

    Paragraphs that start with click's `\\b` marker, and lines of a list or an indented block, keep their breaks.
    """
    paragraphs = inspect.cleandoc(text).split("\n\n")
    joined = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        if paragraph.startswith("\b") or any(re.match(r"\s|[-*•] |\d+\. ", line) for line in lines[1:]):
            joined.append(paragraph)
        else:
            joined.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(joined)


class _PlainArgument(TyperArgument):
    """An argument shown as `CHECKPOINT` (required) or `[NAME]` (optional) in the usage line, not `{checkpoint}`."""

    def get_usage_pieces(self, ctx) -> list[str]:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return [name + ("..." if self.nargs != 1 else "")]


def _tidy_param(param, ctx) -> None:
    if isinstance(param, TyperArgument):
        if param.metavar is None:
            param.metavar = param.name.upper()
        if type(param) is TyperArgument:  # typer builds its arguments itself: swap in the usage wording
            param.__class__ = _PlainArgument
    elif getattr(param, "is_flag", False) and not getattr(param, "count", False):
        param.metavar = ""  # a flag takes no value: `--dry-run`, not `--dry-run <bool>`
    elif param.metavar is None and getattr(param, "multiple", False) and hasattr(param, "display_type"):
        param.metavar = re.sub(r"^<list\[(.*)\]>$", r"<\1>", param.display_type(ctx))


def tidy_help(command) -> None:
    """Tidy the --help of `command` and every command under it (idempotent)."""
    if command.help:
        command.help = unwrap_paragraphs(command.help)
    ctx = command.context_class(command)
    for param in command.params:
        _tidy_param(param, ctx)
    help_option = command.get_help_option(ctx)
    if help_option is not None:
        help_option.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)


HELP_WIDTH_WHEN_NOT_A_TERMINAL = 120


def widen_help_when_not_a_terminal() -> None:
    """Typer renders --help at 80 columns when stdout is not a terminal: give it room so examples stay whole
    (COLUMNS or TERMINAL_WIDTH, when set, still decide)."""
    if not hasattr(rich_utils, "MAX_WIDTH"):
        return
    chosen = os.environ.get("TERMINAL_WIDTH")
    if chosen:
        rich_utils.MAX_WIDTH = int(chosen)
    elif not is_terminal(sys.stdout) and not os.environ.get("COLUMNS"):
        rich_utils.MAX_WIDTH = HELP_WIDTH_WHEN_NOT_A_TERMINAL
    else:
        rich_utils.MAX_WIDTH = None  # rich's own choice: the terminal's width, or COLUMNS


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

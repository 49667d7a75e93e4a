"""Command-line entry point: thin — parse, call a function, map errors to exit codes."""

from __future__ import annotations

import sys


def _install_early_signal_handlers() -> None:
    # A SIGTERM during `import torch` would kill the process before the loop installs its handler.
    if "pretrain" in sys.argv[1:3]:
        from bertrain.train.signals import install_handlers

        install_handlers()


def _command_modules() -> None:
    import bertrain.cli.config_commands  # noqa: F401
    import bertrain.cli.data_commands  # noqa: F401
    import bertrain.cli.model_commands  # noqa: F401
    import bertrain.cli.train_commands  # noqa: F401
    import bertrain.cli.demo_commands  # noqa: F401
    import bertrain.cli.launch_commands  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; errors become a one-paragraph message and an exit code (0/1/2/75)."""
    _install_early_signal_handlers()
    import os

    import typer

    try:  # typer >= 0.2x vendors its own click
        from typer._click import exceptions as click_exceptions
    except ImportError:  # pragma: no cover - older typer uses click itself
        from click import exceptions as click_exceptions

    from bertrain.cli.app import (app, err_console, print_config_warnings, state, tidy_help,
                                  widen_help_when_not_a_terminal)
    from bertrain.errors import EXIT_ERROR, EXIT_USAGE, BertrainError, ConfigError, DataError, Interrupted, UsageError

    _command_modules()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("BERTRAIN_DEBUG", "").lower() in ("1", "true", "yes")
    command = typer.main.get_command(app)
    tidy_help(command)
    widen_help_when_not_a_terminal()
    print_config_warnings()
    try:
        # With standalone_mode=False a `typer.Exit(code)` comes back as the return value.
        return command.main(args=args, prog_name="bertrain", standalone_mode=False) or 0
    except typer.Exit as stop:
        return stop.exit_code
    except typer.Abort:
        err_console.print("Aborted.")
        return EXIT_ERROR
    except click_exceptions.ClickException as error:
        if state.get("debug") or debug:
            raise
        error.show(file=sys.stderr)
        return EXIT_USAGE if isinstance(error, click_exceptions.UsageError) else EXIT_ERROR
    except Interrupted as stopped:  # a preemption handled as designed: the expected outcome, not an error
        if os.environ.get("RANK", "0") == "0":
            err_console.print(str(stopped), markup=False, highlight=False, soft_wrap=True)
        return stopped.exit_code
    except BertrainError as error:
        if state.get("debug") or debug:
            raise
        # Config and data errors are the same on every rank of a multi-process run: say them once.
        if os.environ.get("RANK", "0") == "0" or not isinstance(error, (ConfigError, DataError, UsageError)):
            err_console.print("[bold red]Error:[/] ", end="")
            err_console.print(str(error), markup=False, highlight=False, soft_wrap=True)
        return error.exit_code
    except KeyboardInterrupt:
        err_console.print("Interrupted.")
        return 130
    except Exception as error:  # a bug or an environment problem: still one paragraph, no traceback
        if state.get("debug") or debug:
            raise
        err_console.print("[bold red]Error:[/] ", end="")
        err_console.print(f"{type(error).__name__}: {error}\n"
                          "Run again with --debug (or BERTRAIN_DEBUG=1) for the traceback.", markup=False, highlight=False,
                          soft_wrap=True)
        return EXIT_ERROR


def entry() -> None:
    """Console-script entry point."""
    code = main()
    from bertrain.exit_status import record_exit

    record_exit(code)  # under `bertrain launch`: its exit code is combined from every worker's
    sys.exit(code)

"""Command-line entry point: thin — parse, call a function, map errors to exit codes."""

from __future__ import annotations

import os
import sys


def _install_early_signal_handlers() -> None:
    # A SIGTERM during `import torch` would kill the process before the loop installs its handler.
    if "pretrain" in sys.argv[1:3] or "evaluate" in sys.argv[1:3]:
        from bertrain.train.parent_watch import watch_parent
        from bertrain.train.signals import install_handlers, interrupt_at_startup

        install_handlers()
        interrupt_at_startup()
        watch_parent()  # from the start: a launcher killed while this imports torch left it to train as an orphan
    elif "prepare" in sys.argv[1:3]:
        import signal

        signal.signal(signal.SIGTERM, _prepare_requeue)


def _prepare_requeue(signum: int, frame: object) -> None:
    """SIGTERM to prepare outside its stages (they handle it themselves): nothing is being written, so exit 75
    (requeue) at once, where the default action was a silent exit 143 that a job script does not requeue."""
    from bertrain.errors import EXIT_REQUEUE

    print("prepare stopped by SIGTERM; run the same command again to resume.", file=sys.stderr, flush=True)
    os._exit(EXIT_REQUEUE)  # not an exception: one raised while Python runs a finalizer is printed and dropped


def _command_modules() -> None:
    import bertrain.cli.config_commands  # noqa: F401
    import bertrain.cli.data_commands  # noqa: F401
    import bertrain.cli.model_commands  # noqa: F401
    import bertrain.cli.train_commands  # noqa: F401
    import bertrain.cli.demo_commands  # noqa: F401
    import bertrain.cli.launch_commands  # noqa: F401
    import bertrain.cli.evaluate_commands  # noqa: F401


class KeyboardInterruptSaid(Exception):
    """Ctrl-C in a command that has no stop of its own to say: an Exception, so that typer lets it through."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; errors become a one-paragraph message and an exit code (0/1/2/75/130)."""
    _install_early_signal_handlers()
    import typer

    from bertrain.cli.app import app, print_config_warnings
    from bertrain.cli.launch_commands import print_to_launch_output

    print_to_launch_output()  # in a worker of `bertrain launch`: print where it prints

    _command_modules()
    args = _debug_first(list(sys.argv[1:] if argv is None else argv))
    debug = "--debug" in args or os.environ.get("BERTRAIN_DEBUG", "").lower() in ("1", "true", "yes")
    print_config_warnings()
    command = typer.main.get_command(app)
    invoke = command.invoke

    def invoke_saying_ctrl_c(context):
        try:
            return invoke(context)
        except KeyboardInterrupt:  # typer turns it into a silent exit 130: said here, as Interrupted is
            raise KeyboardInterruptSaid() from None

    command.invoke = invoke_saying_ctrl_c
    try:
        # With standalone_mode=False a `typer.Exit(code)` comes back as the return value.
        return command.main(args=args, prog_name="bertrain", standalone_mode=False) or 0
    except (Exception, KeyboardInterrupt) as error:
        return exit_code_for(error, debug)


def _debug_first(args: list[str]) -> list[str]:
    """`--debug` where users put it, after the command too (`bertrain pretrain … --debug`), moved to the root that
    owns it; not for `launch`, whose own --debug shows the launcher's output, nor after `--`."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    end = args.index("--") if "--" in args else len(args)
    if command == "launch" or "--debug" not in args[:end]:
        return args
    return ["--debug"] + [arg for index, arg in enumerate(args) if arg != "--debug" or index >= end]


def exit_code_for(error: BaseException, debug: bool) -> int:
    """Print `error` as one paragraph on stderr and return its exit code; with `debug`, the traceback first (the
    code stays: a usage error is 2 with or without it, so a job script reads the same)."""
    import typer

    from bertrain.cli.app import err_console
    from bertrain.errors import EXIT_ERROR, BertrainError, ConfigError, DataError, Interrupted, UsageError

    rank_zero = os.environ.get("RANK", "0") == "0"
    if isinstance(error, typer.Exit):
        return error.exit_code
    if isinstance(error, typer.Abort):
        err_console.print("Aborted.")
        return EXIT_ERROR
    if isinstance(error, (KeyboardInterrupt, KeyboardInterruptSaid)):
        err_console.print("Interrupted.")
        return 130
    if isinstance(error, Interrupted):  # a preemption handled as designed: the expected outcome, not an error
        if rank_zero:
            err_console.print(str(error), markup=False, highlight=False, soft_wrap=True)
        return error.exit_code
    if debug:
        import traceback

        traceback.print_exception(type(error), error, error.__traceback__)
    if isinstance(error, typer.TyperException):  # the parser's errors (typer >= 0.26): usage (exit 2) and the like
        error.show(file=sys.stderr)
        return error.exit_code
    if isinstance(error, (ConfigError, DataError, UsageError)) and not rank_zero:
        return error.exit_code  # the same on every rank of a multi-process run: said once, by rank 0
    err_console.print("[bold red]Error:[/] ", end="")
    if isinstance(error, BertrainError):
        err_console.print(str(error), markup=False, highlight=False, soft_wrap=True)
        return error.exit_code
    hint = "" if debug else "\nRun again with --debug (or BERTRAIN_DEBUG=1) for the traceback."
    if isinstance(error, OSError) and error.errno:  # a full disk, a read-only mount, a file in the way: say which
        from bertrain.files import describe_os_error

        err_console.print(describe_os_error(error) + hint, markup=False, highlight=False, soft_wrap=True)
        return EXIT_ERROR
    err_console.print(f"{type(error).__name__}: {error}{hint}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_ERROR


def entry() -> None:
    """Console-script entry point."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C while the CLI itself loads, before main() handles errors
        print("Interrupted.", file=sys.stderr)
        code = 130
    from bertrain.exit_status import record_exit

    record_exit(code)  # under `bertrain launch`: its exit code is combined from every worker's
    sys.exit(code)

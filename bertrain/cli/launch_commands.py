"""`bertrain launch`: run a launcher and exit with the workers' own code (launchers exit 1 whatever their workers
said). The launcher runs in its own process group, gets every stop signal this process gets, and dies with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from bertrain.cli.app import app, err_console

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
# torch's elastic agent (torchrun, accelerate launch) forwards only these to its workers (SIGUSR1 is not
# in its default list) and waits this long for their checkpoint before killing them (30 s by default).
LAUNCHER_DEFAULTS = {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}


def torchrun_command(nproc: int, bertrain_args: list[str]) -> list[str]:
    """torchrun with `nproc` processes on this machine (a free port) running `bertrain ARGS`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "bertrain", *bertrain_args]


def run_launcher(command: list[str], status_dir: Path) -> int:
    """Run `command` in its own process group, forwarding stop signals to the group; its exit code
    (128 + N when signal N ended it)."""
    from bertrain.errors import UsageError
    from bertrain.exit_status import STATUS_DIR_ENV
    from bertrain.train.parent_watch import libc_prctl, set_parent_death_signal

    prctl = libc_prctl()  # looked up here: between fork and exec nothing may be loaded

    def die_with_this_process() -> None:  # a kill -9 here then stops the launcher (and so its workers)
        set_parent_death_signal(signal.SIGTERM, prctl)

    try:
        env = {**LAUNCHER_DEFAULTS, **os.environ, STATUS_DIR_ENV: str(status_dir)}
        child = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=die_with_this_process)
    except (FileNotFoundError, PermissionError) as error:
        raise UsageError(f"Cannot start the launcher '{command[0]}': {error.strerror}. Install it, or give its full "
                         f"path (torchrun is also `python -m torch.distributed.run`).") from None

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass  # the launcher has already exited

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


@app.command("launch", options_metavar="[--nproc N] LAUNCHER ARGS...",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def launch(
    ctx: typer.Context,
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1,
                                        help="Start this many processes on this machine with torchrun; the "
                                             "arguments are then a bertrain command (pretrain …)."),
) -> None:
    """Run a multi-process launcher and exit with the workers' code (0, 1, 2 or 75), not the launcher's.

    LAUNCHER ARGS is the whole launcher command line: `torchrun …` or `accelerate launch …`, running `-m bertrain`.

    SIGTERM, SIGUSR1, SIGINT and SIGHUP reach the workers through the launcher (they checkpoint and exit 75).

    The last line says which code was chosen and why.

    Example: bertrain launch --nproc 2 pretrain -c tiny_bert --data data/pydoc

    Example: bertrain launch torchrun --nproc_per_node 8 -m bertrain pretrain …
    """
    from bertrain.errors import UsageError
    from bertrain.exit_status import combine_exit_codes, read_exits

    command = list(ctx.args)
    if not command:
        raise UsageError("bertrain launch needs a command: `bertrain launch torchrun --nproc_per_node N -m bertrain "
                         "pretrain …`, or `bertrain launch --nproc N pretrain …`.")
    if nproc is not None:
        command = torchrun_command(nproc, command)
    status_dir = Path(tempfile.mkdtemp(prefix="bertrain-exit-"))
    try:
        launcher_code = run_launcher(command, status_dir)
        code, reason = combine_exit_codes(read_exits(status_dir), launcher_code)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    err_console.print(f"bertrain launch: exit {code}: {reason}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)

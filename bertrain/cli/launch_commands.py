"""`bertrain launch`: run a launcher and exit with the workers' own code (launchers exit 1 whatever their workers
said). The launcher runs in its own process group, gets every stop signal this process gets, and dies with it.
Its own output (log lines, tracebacks of workers that stopped as designed) goes to a log file; the workers print
here, on this process's stdout/stderr (reopened through /proc on Linux)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Optional

import typer

from bertrain.cli.app import app, err_console

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
# torch's elastic agent (torchrun, accelerate launch) forwards only these to its workers (SIGUSR1 is not
# in its default list) and waits this long for their checkpoint before killing them (30 s by default).
LAUNCHER_DEFAULTS = {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}
OUTPUT_OF_ENV = "BERTRAIN_LAUNCH_OUTPUT_OF"  # the pid of `bertrain launch`, whose stdout/stderr the workers use


def torchrun_command(nproc: int, bertrain_args: list[str]) -> list[str]:
    """torchrun with `nproc` processes on this machine (a free port) running `bertrain ARGS`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "bertrain", *bertrain_args]


def launcher_log(command: list[str]) -> Path:
    """Where the launcher's output goes: RUN_DIR/launcher.log when the command names --run-dir, else a new file
    in the temporary directory."""
    from bertrain.rundir import LAUNCHER_LOG

    for index, arg in enumerate(command):
        run_dir = command[index + 1] if arg == "--run-dir" and index + 1 < len(command) else \
            arg.removeprefix("--run-dir=") if arg.startswith("--run-dir=") else None
        if run_dir:
            with contextlib.suppress(OSError):
                Path(run_dir).mkdir(parents=True, exist_ok=True)
                return Path(run_dir) / LAUNCHER_LOG
    return Path(tempfile.gettempdir()) / f"bertrain-launch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def _reopen_output(pid: int, fd: int) -> int:
    """A new descriptor onto process `pid`'s descriptor `fd` (OSError without /proc, or for a socket)."""
    return os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)  # into a file: after what is there


def workers_can_print_here() -> bool:
    """Whether the workers can write to this process's stdout and stderr themselves (see print_to_launch_output)."""
    try:
        for fd in (1, 2):
            os.close(_reopen_output(os.getpid(), fd))
    except OSError:
        return False
    return True


def print_to_launch_output() -> None:
    """In a worker of `bertrain launch` whose launcher writes to a log: write stdout/stderr where `bertrain
    launch` writes them (a terminal, a pipe, a job's output file). Where that cannot be opened (no /proc, a
    socket), the worker's output stays in the launcher's log."""
    launch_pid = os.environ.pop(OUTPUT_OF_ENV, None)
    if not launch_pid:
        return
    for fd in (1, 2):
        try:
            target = _reopen_output(int(launch_pid), fd)
        except (OSError, ValueError):
            continue
        os.dup2(target, fd)
        os.close(target)


def _to_end_of_files() -> None:
    """Before this process writes: where stdout/stderr are files, the workers appended to them; write after that."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
            if stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                os.lseek(stream.fileno(), 0, os.SEEK_END)


def _tail(log_path: Path, start: int, lines: int = 20) -> str:
    """The last `lines` lines the launcher wrote to `log_path` from byte `start` on (this run's part)."""
    with open(log_path, "rb") as handle:
        handle.seek(start)
        written = handle.read().decode(errors="replace").splitlines()
    return "\n".join([f"bertrain launch: the launcher's last lines ({log_path}):", *written[-lines:]])


def run_launcher(command: list[str], status_dir: Path, log: Optional[IO] = None) -> int:
    """Run `command` in its own process group, forwarding stop signals to the group; its exit code
    (128 + N when signal N ended it). With `log`, the launcher's stdout and stderr go there."""
    from bertrain.errors import UsageError
    from bertrain.exit_status import STATUS_DIR_ENV
    from bertrain.train.parent_watch import libc_prctl, set_parent_death_signal

    prctl = libc_prctl()  # looked up here: between fork and exec nothing may be loaded

    def die_with_this_process() -> None:  # a kill -9 here then stops the launcher (and so its workers)
        set_parent_death_signal(signal.SIGTERM, prctl)

    try:
        env = {**LAUNCHER_DEFAULTS, **os.environ, STATUS_DIR_ENV: str(status_dir)}
        if log is not None:
            env[OUTPUT_OF_ENV] = str(os.getpid())
        child = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=die_with_this_process,
                                 stdout=log, stderr=log)
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


@app.command("launch", options_metavar="[--nproc N] [--debug] LAUNCHER ARGS...",
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def launch(
    ctx: typer.Context,
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1,
                                        help="Start this many processes on this machine with torchrun; the "
                                             "arguments are then a bertrain command (pretrain …)."),
    debug: bool = typer.Option(False, "--debug", help="Show the launcher's own output (its log lines and "
                                                      "tracebacks) here instead of in a log file."),
) -> None:
    """Run a multi-process launcher and exit with the workers' code (0, 1, 2, 75 or 130), not the launcher's.

    LAUNCHER ARGS is the whole launcher command line: `torchrun …` or `accelerate launch …`, running `-m bertrain`.

    Stop signals (SIGTERM, SIGUSR1, SIGINT, SIGHUP) reach the workers through the launcher; after SIGTERM or SIGUSR1 they checkpoint and exit 75.

    Ctrl-C (SIGINT): they checkpoint and exit 130; a second Ctrl-C stops them at once.

    The processes print here; the launcher's own output goes to a log file named on the first line.

    That is RUN_DIR/launcher.log with --run-dir, else a file in the temp directory; --debug shows it here instead.

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
    debug = debug or bool(ctx.find_root().params.get("debug"))
    # Without a way for the workers to print here (no /proc, a socket), everything stays here, as with --debug.
    log_path = None if debug or not workers_can_print_here() else launcher_log(command)
    status_dir = Path(tempfile.mkdtemp(prefix="bertrain-exit-"))
    try:
        with contextlib.ExitStack() as stack:
            log, log_start = None, 0
            if log_path is not None:
                log = stack.enter_context(open(log_path, "a", encoding="utf-8"))
                log.write(f"\n=== bertrain launch, {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(command)}\n")
                log.flush()
                log_start = log.tell()
                err_console.print(f"bertrain launch: the launcher's own output goes to {log_path} (--debug shows it "
                                  "here).", markup=False, highlight=False, soft_wrap=True)
            launcher_code = run_launcher(command, status_dir, log)
        exits = read_exits(status_dir)
        code, reason = combine_exit_codes(exits, launcher_code)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    _to_end_of_files()
    if log_path is not None and not exits and launcher_code != 0:  # it failed by itself (bad arguments…): show why
        err_console.print(_tail(log_path, log_start), markup=False, highlight=False, soft_wrap=True)
    where = f"; the launcher's output: {log_path}" if log_path is not None and code != 0 else ""
    err_console.print(f"bertrain launch: exit {code}: {reason}{where}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)

"""`bertrain launch`: run a launcher and exit with the workers' own code (launchers exit 1 whatever their workers
said). The launcher runs in its own process group, gets every stop signal this process gets, and dies with it.
Its own output (log lines, tracebacks of workers that stopped as designed) goes to a log file; the workers print
here, on this process's stdout/stderr (reopened through /proc on Linux). When the launcher dies (kill -9) its
workers get SIGTERM and save: this process waits for them before it reads their codes."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import stat
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
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # also how long launch waits if the launcher dies
LAUNCHER_DEFAULTS = {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", SHUTDOWN_TIMEOUT_ENV: "600"}
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
    """In a worker of `bertrain launch`: record its pid (launch waits for it should the launcher die), and, where
    the launcher writes to a log, write stdout/stderr where `bertrain launch` writes them (a terminal, a pipe, a
    job's output file). Where that cannot be opened (no /proc, a socket), the worker's output stays in the log."""
    from bertrain.exit_status import record_start

    record_start()  # here: the one call every bertrain process makes at its start
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


def _say(text: str) -> None:
    _to_end_of_files()
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


def shutdown_timeout() -> float:
    """How long the launcher waits for its workers' checkpoint after a stop signal (seconds), as set for it."""
    try:
        return max(0.0, float(os.environ.get(SHUTDOWN_TIMEOUT_ENV) or LAUNCHER_DEFAULTS[SHUTDOWN_TIMEOUT_ENV]))
    except ValueError:
        return float(LAUNCHER_DEFAULTS[SHUTDOWN_TIMEOUT_ENV])


def wait_for_orphans(status_dir: Path, launcher_code: int, received: list[int] | tuple[int, ...] = (),
                     poll_seconds: float = 0.2) -> None:
    """After the launcher ended: wait for the workers of this launch that still run. A launcher killed with -9
    leaves them finishing the step and saving (their parent-death signal); their codes are recorded only then,
    and a relaunch must not meet them on RUN_DIR's lock. The wait is as long as the launcher itself would give
    them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT); those still running after it are killed, as the launcher would.
    Stop signals to this process go to them meanwhile, as the launcher would have passed them on."""
    from bertrain.exit_status import is_running, read_starts

    running = [worker for worker in read_starts(status_dir) if is_running(worker)]
    if not running:  # the usual case: the launcher waited for its workers itself
        return
    timeout = shutdown_timeout()
    _say(f"bertrain launch: the launcher ended (exit {launcher_code}) while {len(running)} of its processes still "
         f"run (pid {', '.join(str(worker.pid) for worker in running)}): waiting up to {timeout:g} s for them to "
         "finish the step, save and exit.")

    def forward(signum: int, frame: object) -> None:
        for worker in running:
            with contextlib.suppress(OSError):
                if is_running(worker):
                    os.kill(worker.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    for signum in list(received):  # what came after the launcher ended, before this forwarding
        forward(signum, None)
    try:
        deadline = time.monotonic() + timeout
        while running and time.monotonic() < deadline:
            time.sleep(poll_seconds)
            running = [worker for worker in running if is_running(worker)]
        for worker in running:
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic() + 60  # until they are gone (and RUN_DIR's lock with them): soon after a SIGKILL
        while any(is_running(worker) for worker in running) and time.monotonic() < killed:
            time.sleep(poll_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if running:
        _say(f"bertrain launch: {len(running)} process(es) still ran after {timeout:g} s (pid "
             f"{', '.join(str(worker.pid) for worker in running)}): killed.")


def _tail(log_path: Path, start: int, lines: int = 20) -> str:
    """The last `lines` lines the launcher wrote to `log_path` from byte `start` on (this run's part)."""
    with open(log_path, "rb") as handle:
        handle.seek(start)
        written = handle.read().decode(errors="replace").splitlines()
    return "\n".join([f"bertrain launch: the launcher's last lines ({log_path}):", *written[-lines:]])


def run_launcher(command: list[str], status_dir: Path, log: Optional[IO] = None) -> int:
    """Run `command` in its own process group, forwarding stop signals to the group; its exit code
    (128 + N when signal N ended it). With `log`, the launcher's stdout and stderr go there."""
    from bertrain.child_process import run_forwarding_signals
    from bertrain.errors import UsageError
    from bertrain.exit_status import STATUS_DIR_ENV

    env = {**LAUNCHER_DEFAULTS, **os.environ, STATUS_DIR_ENV: str(status_dir)}
    if log is not None:
        env[OUTPUT_OF_ENV] = str(os.getpid())
    try:  # its own session and group, all of which gets each stop signal; it dies with this process (kill -9)
        return run_forwarding_signals(command, FORWARDED_SIGNALS, to_group=True, new_session=True, env=env,
                                      stdout=log, stderr=log)
    except (FileNotFoundError, PermissionError) as error:
        raise UsageError(f"Cannot start the launcher '{command[0]}': {error.strerror}. Install it, or give its full "
                         f"path (torchrun is also `python -m torch.distributed.run`).") from None


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

    If the launcher dies (kill -9), its processes save and exit 75; this waits for them (as the launcher would).

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
    # Between the launcher's end and the orphan wait a stop signal is kept for the workers, not our death (143).
    between: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: between.append(signum)) for sig in FORWARDED_SIGNALS}
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
        wait_for_orphans(status_dir, launcher_code, between)  # before the directory goes: they record codes in it
        exits = read_exits(status_dir)
        code, reason = combine_exit_codes(exits, launcher_code)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(status_dir, ignore_errors=True)
    _to_end_of_files()
    if log_path is not None and not exits and launcher_code != 0:  # it failed by itself (bad arguments…): show why
        err_console.print(_tail(log_path, log_start), markup=False, highlight=False, soft_wrap=True)
    where = f"; the launcher's output: {log_path}" if log_path is not None and code != 0 else ""
    err_console.print(f"bertrain launch: exit {code}: {reason}{where}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)

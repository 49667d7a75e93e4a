"""`bertrain launch` hands the workers' exit code (0/1/2/75) to the job script; workers stop when their launcher dies.

Plain torchrun ends with exit 1 after a preemption the workers handled (75) or a bad config (2): the
multi-process tests check that `bertrain launch` returns the workers' codes instead. Fake launchers (a
few lines of Python) test the plumbing, signal forwarding and parent death without torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertrain.cli.launch_commands import torchrun_command
from bertrain.exit_status import (STATUS_DIR_ENV, WorkerExit, WorkerStart, combine_exit_codes, is_running,
                                  read_exits, read_starts, record_exit, record_start)
from bertrain.train.parent_watch import watch_parent
from tests.helpers import ROOT, default_ctrl_c, explain, pretrain_env, wait_for_file, write_config

WAIT = 300  # seconds: generous, for a loaded machine; no test measures time


def launch(*args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bertrain", "launch", *args], env=env or pretrain_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c,
                            **popen)


def finish(process: subprocess.Popen, timeout: float = WAIT) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# ---------------------------------------------------------------------------------------------
# How worker codes combine
# ---------------------------------------------------------------------------------------------


def workers(*codes: int, local_world_size: int | None = None) -> list[WorkerExit]:
    size = local_world_size or len(codes)
    return [WorkerExit(rank, code, size) for rank, code in enumerate(codes)]


@pytest.mark.parametrize("codes, launcher, expected", [
    ((75, 75), 1, 75),      # preemption handled by every worker; torchrun said 1
    ((2, 2), 1, 2),         # bad config on every rank
    ((2, 1), 1, 2),         # a config error explains the other rank's failure
    ((75, 1), 1, 1),        # one rank failed: no requeue on a crash
    ((0, 75), 1, 75),       # a rank that had finished does not hide the checkpointed stop
    ((0, 0), 0, 0),
    ((130, 130), 1, 130),   # Ctrl-C: the workers' own code
    ((75, 130), 1, 1),      # different stops: an error
    ((), 7, 7),             # nobody wrote: the launcher's code
])
def test_worker_codes_combine_into_the_job_code(codes, launcher, expected):
    code, reason = combine_exit_codes(workers(*codes), launcher)
    assert code == expected, reason
    assert reason


def test_a_silent_worker_turns_success_into_an_error_but_keeps_a_requeue():
    code, reason = combine_exit_codes(workers(0, local_world_size=2), launcher_code=1)
    assert code == 1 and "1 of 2 worker(s) ended without a status" in reason
    code, reason = combine_exit_codes(workers(75, local_world_size=2), launcher_code=1)
    assert code == 75 and "requeue" in reason


def test_record_exit_writes_one_file_per_rank_and_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(STATUS_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record_exit(75)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(STATUS_DIR_ENV, str(tmp_path))
    for rank, code in ((1, 75), (0, 2)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        record_exit(code)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rank-0.json", "rank-1.json"]  # no temporary left
    assert json.loads((tmp_path / "rank-1.json").read_text())["code"] == 75
    (tmp_path / "rank-2.json").write_text('{"rank": 2, "co')  # torn: that worker counts as silent
    assert read_exits(tmp_path) == [WorkerExit(0, 2, 2), WorkerExit(1, 75, 2)]


# ---------------------------------------------------------------------------------------------
# The launch command with fake launchers (no torch)
# ---------------------------------------------------------------------------------------------

# Plays torchrun: two "workers" record their codes, then the launcher itself fails the way torchrun does.
FAKE_LAUNCHER = """
import os, sys
from bertrain.exit_status import record_exit
for rank, code in enumerate(sys.argv[1:]):
    os.environ.update(RANK=str(rank), LOCAL_WORLD_SIZE=str(len(sys.argv) - 1))
    record_exit(int(code))
sys.exit(1)
"""

# Waits for a signal; on SIGTERM its "workers" checkpoint and record 75; dies on SIGKILL of its parent.
WAITING_LAUNCHER = """
import os, signal, sys, time
from pathlib import Path
from bertrain.exit_status import record_exit
def stop(signum, frame):
    Path(sys.argv[2]).write_text(signal.Signals(signum).name)
    record_exit(75)
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(600)
"""


@pytest.mark.parametrize("codes, expected", [(("75", "75"), 75), (("2", "2"), 2), (("0", "0"), 0), (("0", "1"), 1)])
def test_launch_exits_with_what_the_workers_recorded(codes, expected):
    result = finish(launch(sys.executable, "-c", FAKE_LAUNCHER, *codes))
    assert result.returncode == expected, explain(result)
    assert f"bertrain launch: exit {expected}:" in result.stderr


def test_launch_without_status_files_keeps_the_launchers_code_and_shows_its_last_lines():
    result = finish(launch(sys.executable, "-c", "import sys; print('torchrun: error: bad argument'); sys.exit(7)"))
    assert result.returncode == 7, explain(result)
    assert "no worker recorded an exit status" in result.stderr
    assert "torchrun: error: bad argument" in result.stderr  # a launcher that failed by itself: its log's end, here


def test_launch_refuses_a_missing_command_or_launcher(run_cli):
    code, _, err = run_cli("launch")
    assert code == 2 and "needs a command" in " ".join(err.split())
    code, _, err = run_cli("launch", "no-such-launcher-4711", "--nproc_per_node", "2")
    assert code == 2 and "no-such-launcher-4711" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_launch_reaches_the_launcher_and_gives_75(tmp_path, sig):
    ready, got = tmp_path / "ready", tmp_path / "got"
    process = launch(sys.executable, "-c", WAITING_LAUNCHER, str(ready), str(got))
    try:
        wait_for_file(ready, timeout=WAIT)
        process.send_signal(sig)
        result = finish(process)
    finally:
        process.kill()
    assert got.read_text() == sig.name
    assert result.returncode == 75, explain(result)


# A launcher that prints a traceback of its own and starts a worker that prints on stdout and stderr, then fails.
NOISY_LAUNCHER = """
import subprocess, sys
print("Traceback (most recent call last): the launcher's own noise", file=sys.stderr, flush=True)
subprocess.run([sys.executable, "-c", "import sys; from bertrain.cli.launch_commands import print_to_launch_output; "
                "print_to_launch_output(); print('worker stdout'); print('worker stderr', file=sys.stderr); "
                "from bertrain.exit_status import record_exit; record_exit(1)"])
sys.exit(1)
"""


def test_the_launchers_output_goes_to_the_log_it_names_and_the_workers_print_here(tmp_path):
    run_dir = tmp_path / "run"
    result = finish(launch(sys.executable, "-c", NOISY_LAUNCHER, "--run-dir", str(run_dir)))
    log = run_dir / "launcher.log"
    assert f"the launcher's own output goes to {log}" in " ".join(result.stderr.split())
    assert "worker stdout" in result.stdout and "worker stderr" in result.stderr, explain(result)
    assert "Traceback" not in result.stderr + result.stdout, explain(result)
    lines = log.read_text().splitlines()  # the first line is the command
    assert "Traceback (most recent call last): the launcher's own noise" in lines
    assert "worker stdout" not in lines and "worker stderr" not in lines
    assert result.returncode == 1 and f"the launcher's output: {log}" in " ".join(result.stderr.split())


def test_into_a_job_output_file_nobody_overwrites_anybody(tmp_path):
    # SLURM's job.out: launch's stdout and stderr are one file, which the workers reopen to append to.
    job_out = tmp_path / "job.out"
    with open(job_out, "w") as handle:
        subprocess.run([sys.executable, "-m", "bertrain", "launch", sys.executable, "-c", NOISY_LAUNCHER, "--run-dir",
                        str(tmp_path / "run")], env=pretrain_env(), cwd=ROOT, stdout=handle, stderr=handle,
                       timeout=WAIT)
    lines = job_out.read_text().splitlines()
    assert lines[0].startswith("bertrain launch: the launcher's own output goes to"), lines
    assert "worker stdout" in lines and "worker stderr" in lines, lines
    assert lines[-1].startswith("bertrain launch: exit 1:"), lines


def test_launch_debug_shows_the_launchers_output_and_writes_no_log(tmp_path):
    run_dir = tmp_path / "run"
    result = finish(launch("--debug", sys.executable, "-c", NOISY_LAUNCHER, "--run-dir", str(run_dir)))
    assert "the launcher's own noise" in result.stderr and "worker stdout" in result.stdout, explain(result)
    assert not (run_dir / "launcher.log").exists()


def test_kill_9_of_launch_stops_the_launcher(tmp_path):
    ready, got = tmp_path / "ready", tmp_path / "got"
    process = launch(sys.executable, "-c", WAITING_LAUNCHER, str(ready), str(got))
    launcher = int(wait_for_file(ready, timeout=WAIT))
    try:
        process.kill()
        process.communicate(timeout=WAIT)
        assert wait_for_file(got, timeout=60) == "SIGTERM"
    finally:
        try:
            os.kill(launcher, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_record_start_names_the_process_until_it_ends_or_its_pid_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(STATUS_DIR_ENV, str(tmp_path))
    record_start()
    (me,) = read_starts(tmp_path)
    assert me.pid == os.getpid() and is_running(me)
    if me.started is not None:  # with /proc: a process of that pid that started at another time is another one
        assert not is_running(WorkerStart(me.pid, me.started + 1))
    ended = subprocess.Popen([sys.executable, "-c", "from bertrain.exit_status import record_start; record_start()"],
                             env={**pretrain_env(), STATUS_DIR_ENV: str(tmp_path)}, cwd=ROOT)
    ended.wait(timeout=WAIT)
    (other,) = [worker for worker in read_starts(tmp_path) if worker.pid == ended.pid]
    assert not is_running(other)


# Plays a torchrun killed with -9: starts a "worker" (argv[1]: its code), waits until it runs, then dies by SIGKILL.
ORPHANING_LAUNCHER = """
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
ready = sys.argv[2]
while not os.path.exists(ready) and worker.poll() is None:
    time.sleep(0.05)
if sys.argv[3] == "dies":
    worker.wait()
os.kill(os.getpid(), signal.SIGKILL)
"""
# The worker of a killed launcher: saves when told (the file argv[2] + ".go" appears; here the test tells it,
# in a real run its parent-death signal does), records 75 and exits.
SAVING_WORKER = """
import os, sys, time
from pathlib import Path
from bertrain.cli.launch_commands import print_to_launch_output
from bertrain.exit_status import record_exit
print_to_launch_output()
Path(sys.argv[1]).write_text(str(os.getpid()))
while not Path(sys.argv[1] + ".go").exists():
    time.sleep(0.05)
record_exit(75)
"""
# A worker that records its start, then hangs (ignoring SIGTERM) or dies by SIGKILL without recording an exit.
STUCK_WORKER = """
import os, signal, sys, time
from pathlib import Path
from bertrain.cli.launch_commands import print_to_launch_output
print_to_launch_output()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(sys.argv[1]).write_text(str(os.getpid()))
if sys.argv[2] == "dies":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)
"""


def test_launch_waits_for_the_workers_of_a_killed_launcher_and_exits_with_their_code(tmp_path):
    ready = tmp_path / "ready"
    process = launch(sys.executable, "-c", ORPHANING_LAUNCHER, SAVING_WORKER, str(ready), "lives")
    try:
        lines = []
        while not any("waiting up to" in line for line in lines):  # said once the launcher is gone
            lines.append(process.stderr.readline())
            assert lines[-1], f"launch ended without waiting: {lines}"
        worker = int(ready.read_text())
        assert f"(exit 137) while 1 of its processes still run (pid {worker})" in " ".join(" ".join(lines).split())
        assert process.poll() is None  # it waits while the worker saves …
        Path(f"{ready}.go").write_text("")
        result = finish(process)
    finally:
        process.kill()
    assert result.returncode == 75, explain(result)  # … and takes its code, not the launcher's 137
    assert "bertrain launch: exit 75: rank(s) 0 stopped by a signal" in " ".join(result.stderr.split())
    assert "could not record" not in result.stderr


# A worker that saves and records 75 when a stop signal reaches it (its dead launcher's SIGTERM, say).
SIGNALLED_WORKER = """
import os, signal, sys, time
from pathlib import Path
from bertrain.exit_status import record_exit, record_start
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
record_start()
Path(sys.argv[1]).write_text(str(os.getpid()))
while not got:
    time.sleep(0.02)
record_exit(75)
"""


def test_a_stop_signal_between_the_launcher_s_end_and_the_wait_reaches_the_workers(tmp_path, monkeypatch):
    # launch restored the default handlers when the launcher ended: a SIGTERM before the orphan wait killed it (143)
    # and left the saving workers unwaited. Now it is kept, and passed on once the wait knows the workers.
    from bertrain.cli.launch_commands import wait_for_orphans
    from bertrain.exit_status import read_exits

    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "60")  # without the signal: killed, no record, a failure
    status, ready = tmp_path / "status", tmp_path / "ready"
    status.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", SIGNALLED_WORKER, str(ready)], cwd=ROOT,
                              env=pretrain_env(BERTRAIN_EXIT_STATUS_DIR=str(status), RANK="0"))
    try:
        wait_for_file(ready, timeout=WAIT)
        wait_for_orphans(status, 137, [signal.SIGTERM])  # returns once the worker, told, has saved and exited
        assert worker.wait(timeout=WAIT) == 0
        assert [exit.code for exit in read_exits(status)] == [75]
    finally:
        worker.kill()


@pytest.mark.parametrize("fate", ["dies", "hangs"])
def test_workers_that_never_record_do_not_hold_launch_forever(tmp_path, fate):
    ready = tmp_path / "ready"
    # A worker killed with -9 is not waited for; one that hangs gets TORCH_ELASTIC_SHUTDOWN_TIMEOUT, then SIGKILL.
    process = launch(sys.executable, "-c", ORPHANING_LAUNCHER, STUCK_WORKER, str(ready), fate,
                     env=pretrain_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1"))
    try:
        result = finish(process)
    finally:
        process.kill()
    worker = int(ready.read_text())
    assert result.returncode == 137, explain(result)
    assert "no worker recorded an exit status; the launcher's exit code 137 stands" in " ".join(result.stderr.split())
    assert ("waiting up to 1 s" in result.stderr) == (fate == "hangs"), explain(result)
    if fate == "hangs":
        assert f"still ran after 1 s (pid {worker}): killed" in " ".join(result.stderr.split())
    assert not is_running(WorkerStart(worker))  # gone, or a zombie where the new parent (pid 1) never reaps


# ---------------------------------------------------------------------------------------------
# Parent death (bertrain.train.parent_watch)
# ---------------------------------------------------------------------------------------------

WORKER = """
import os, signal, sys, time
from pathlib import Path
from bertrain.train.parent_watch import watch_parent
got = Path(sys.argv[2])
def orphaned():
    got.write_text("callback")
def stopped(signum, frame):
    got.write_text(signal.Signals(signum).name)
    os._exit(0)
signal.signal(signal.SIGTERM, stopped)
assert watch_parent(orphaned if sys.argv[3] == "callback" else None, poll_seconds=0.05)
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(600)
"""
# The worker's launcher: starts it, then waits to be killed.
PARENT = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c'] + sys.argv[1:]); time.sleep(600)"


@pytest.mark.parametrize("mode, expected", [("default", "SIGTERM"), ("callback", "callback")])
def test_a_worker_whose_launcher_is_killed_9_is_told(tmp_path, mode, expected):
    ready, got = tmp_path / "ready", tmp_path / "got"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, WORKER, str(ready), str(got), mode],
                              env=pretrain_env(LOCAL_RANK="0"), cwd=ROOT)
    worker = int(wait_for_file(ready, timeout=WAIT))
    try:
        assert not got.exists()
        parent.kill()
        parent.wait(timeout=WAIT)
        assert wait_for_file(got, timeout=60) == expected
    finally:
        parent.kill()
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_worker_watches_its_launcher_from_its_first_line_and_once(tmp_path):
    # The loop set the parent-death signal only after imports and setup (seconds): a launcher killed then left its
    # worker to train as an orphan. The CLI sets it first; the loop's second call starts no second watch.
    code = ("import ctypes, signal, sys\n"
            "sys.argv = ['bertrain', 'pretrain', '--config', 'tiny_bert']\n"
            "from bertrain import cli\n"
            "from bertrain.train import parent_watch\n"
            "cli._install_early_signal_handlers()\n"
            "value = ctypes.c_int(0)\n"
            "assert ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0) == 0  # PR_GET_PDEATHSIG\n"
            "assert value.value == signal.SIGTERM, value.value\n"
            "parent_watch.set_parent_death_signal = lambda *a, **k: False  # where prctl is missing: a thread\n"
            "assert parent_watch.watch_parent() is True\n"
            "import threading\n"
            "assert not [t for t in threading.enumerate() if t.name == 'bertrain-parent-watch']\n"
            "print('watched once')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=WAIT,
                            env=pretrain_env(LOCAL_RANK="0"))
    assert result.returncode == 0 and result.stdout.strip() == "watched once", result.stderr


def test_parent_watch_is_off_outside_a_launcher(monkeypatch):
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert watch_parent() is False


# ---------------------------------------------------------------------------------------------
# Real launchers, 2 CPU processes (gloo)
# ---------------------------------------------------------------------------------------------


def torchrun(*bertrain_args: str) -> list[str]:
    return torchrun_command(2, list(bertrain_args))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("launch") / "tiny.yaml",
                        train={"max_steps": 4, "save_every": 4, "eval_every": 0})


@pytest.mark.multiprocess
def test_a_bad_config_under_torchrun_exits_2(tiny_data, tiny_config, tmp_path):
    result = finish(launch(*torchrun("pretrain", "--config", str(tiny_config), "--data", str(tiny_data),
                                     "--run-dir", str(tmp_path / "run"), "--set", "optim.learning_rate=1")))
    assert "ChildFailedError" in (tmp_path / "run" / "launcher.log").read_text()  # torchrun itself failed with 1 …
    assert "Traceback" not in result.stderr  # (in the launcher's log, not here)
    assert result.returncode == 2, explain(result)  # … the job script sees the workers' 2
    assert "bertrain launch: exit 2: rank(s) 0,1 refused the config" in " ".join(result.stderr.split())


@pytest.mark.multiprocess
def test_a_preempted_torchrun_run_exits_75_with_its_checkpoint_then_finishes_with_0(tiny_data, tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    args = ("pretrain", "--config", str(tiny_config), "--data", str(tiny_data), "--run-dir", str(run_dir))
    # Rank 0 receives SIGTERM during step 2; both ranks save step 2 and exit 75.
    result = finish(launch(*torchrun(*args), env=pretrain_env(BERTRAIN_TEST_SIGNAL_AT_STEP="2")))
    assert result.returncode == 75, explain(result)
    assert "ChildFailedError" in (run_dir / "launcher.log").read_text()  # what plain torchrun ends with (exit 1)
    checkpoint = run_dir / "checkpoints" / "step-00000002"
    assert (checkpoint / "rng-rank00001.json").is_file() and (checkpoint / "model.safetensors").is_file()
    # The requeued job: the same command through the short form finishes the run.
    result = finish(launch("--nproc", "2", *args))
    assert result.returncode == 0, explain(result)
    assert "bertrain launch: exit 0: all 2 worker(s) finished" in result.stderr
    assert (run_dir / "checkpoints" / "step-00000004" / "rng-rank00001.json").is_file()


@pytest.mark.multiprocess
def test_ctrl_c_under_launch_stops_every_rank_after_one_step_with_one_checkpoint(tiny_data, tiny_config, tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "paused"
    args = ("--nproc", "2", "pretrain", "--config", str(tiny_config), "--data", str(tiny_data), "--run-dir",
            str(run_dir))
    # Rank 0 pauses before step 2 until the signal; Ctrl-C reaches `bertrain launch` (the terminal's group).
    process = launch(*args, env=pretrain_env(BERTRAIN_TEST_PAUSE_AT_STEP=f"2:{marker}"))
    try:
        wait_for_file(marker, timeout=WAIT)
        process.send_signal(signal.SIGINT)
        result = finish(process)
    finally:
        process.kill()
    assert result.returncode == 130, explain(result)
    text = " ".join(result.stderr.split())
    assert "Stopped by Ctrl-C after step 2; checkpoint saved" in text and "the same command resumes" in text
    assert "bertrain launch: exit 130: rank(s) 0,1 stopped by Ctrl-C" in text
    assert "Traceback" not in result.stderr, explain(result)
    assert "SignalException" in (run_dir / "launcher.log").read_text()  # the launcher's traceback, kept there
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000002"]  # one, of both ranks
    assert (run_dir / "checkpoints" / "step-00000002" / "rng-rank00001.json").is_file()
    result = finish(launch(*args))
    assert result.returncode == 0, explain(result)
    assert (run_dir / "checkpoints" / "step-00000004" / "rng-rank00001.json").is_file()


def parent_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds torchrun through /proc")
def test_kill_9_of_torchrun_under_launch_waits_for_the_checkpoint_exits_75_and_a_relaunch_resumes(
        tiny_data, tiny_config, tmp_path):
    run_dir, marker, tmp = tmp_path / "run", tmp_path / "paused", tmp_path / "tmp"
    tmp.mkdir()  # launch's exit-status directory goes here, where the test finds the workers' pids
    args = ("--nproc", "2", "pretrain", "--config", str(tiny_config), "--data", str(tiny_data), "--run-dir",
            str(run_dir))
    # Rank 0 pauses before step 2 until its parent-death SIGTERM; rank 1 waits for it in step 2's collectives.
    process = launch(*args, env=pretrain_env(BERTRAIN_TEST_PAUSE_AT_STEP=f"2:{marker}", TMPDIR=str(tmp)))
    try:
        rank_zero = int(wait_for_file(marker, timeout=WAIT))
        (status_dir,) = tmp.glob("bertrain-exit-*")
        workers = read_starts(status_dir)
        assert rank_zero in [worker.pid for worker in workers] and len(workers) == 2, workers
        os.kill(parent_of(rank_zero), signal.SIGKILL)  # torchrun
        result = finish(process)
    finally:
        process.kill()
    text = " ".join(result.stderr.split())
    assert result.returncode == 75, explain(result)  # not the launcher's 137: the job script requeues
    assert "(exit 137) while 2 of its processes still run" in text, explain(result)
    assert "bertrain launch: exit 75: rank(s) 0,1 stopped by a signal after writing a checkpoint" in text
    assert "could not record" not in result.stderr, explain(result)
    assert not any(is_running(worker) for worker in workers)  # no orphan left
    assert not status_dir.exists()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000002"]  # the step reached
    assert (run_dir / "checkpoints" / "step-00000002" / "rng-rank00001.json").is_file()
    result = finish(launch(*args))  # at once: no RUN_DIR lock held by an orphan
    assert result.returncode == 0, explain(result)
    assert "Resuming from" in result.stdout + result.stderr and "(step 2," in result.stdout + result.stderr
    assert (run_dir / "checkpoints" / "step-00000004" / "rng-rank00001.json").is_file()

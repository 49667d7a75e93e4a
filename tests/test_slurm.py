"""examples/slurm/pretrain.sbatch on a real (single-node) SLURM: preempt with USR1, requeue, resume.

tests/slurm/install_slurm.sh installs and starts SLURM from Debian's packages (CI runs it); where
no SLURM controller answers, that test is skipped with the reason. The script's own decisions (requeue or
not, threads, srun's CPUs) are checked everywhere, with fake `srun`, `scontrol` and python on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import signal
import sys
import time

import pytest

from tests.helpers import (ROOT, assert_same_weights, explain, final_weights, make_prepared_dir, pretrain_env,
                           run_pretrain, train_losses, write_config)

SBATCH = ROOT / "examples" / "slurm" / "pretrain.sbatch"
STEPS = 12


def slurm_ready() -> str | None:
    """None when a SLURM node can run jobs here, else why not."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return "SLURM is not installed (run tests/slurm/install_slurm.sh as root)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sinfo failed: {error}"
    if not re.search(r"\b(idle|mixed|allocated)\b", states):
        return f"no usable SLURM node (sinfo states: {states.strip() or 'none'}); run tests/slurm/install_slurm.sh"
    return None


def job_field(job: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=20).stdout
    match = re.search(rf"\b{name}=(\S+)", out)
    return match.group(1) if match else ""


def test_template_is_valid_bash_with_the_multi_node_launch():
    text = SBATCH.read_text()
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    for needed in ("#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", "--num_machines \"$NNODES\"",
                   "--machine_rank \"$SLURM_NODEID\"", "--main_process_ip \"$MAIN_IP\"", "scontrol requeue",
                   "--resume auto", "srun"):
        assert needed in text, needed


FAKES = {
    # Drops srun's options and runs the task, forwarding USR1 and TERM to it as srun does.
    "srun": """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_DIR/srun_args"
while [[ "$1" == --* ]]; do shift; done
export SLURM_NODEID=0
"$@" &
child=$!
trap 'kill -USR1 $child' USR1; trap 'kill -TERM $child' TERM
wait $child; rc=$?  # a task that already ended is waited for here: its status, not the loop's kill -0
while kill -0 $child 2>/dev/null; do wait $child; rc=$?; done  # a forwarded signal ended the wait early
exit $rc
""",
    "scontrol": """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo localhost; else echo "$*" >> "$FAKE_DIR/scontrol"; fi
""",
    # The training processes: exit FAKE_EXIT at once, or on USR1/TERM exit FAKE_EXIT_ON_SIGNAL.
    "python": """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_DIR/python_args"
echo "$OMP_NUM_THREADS" > "$FAKE_DIR/omp"
[ -n "${FAKE_EXIT:-}" ] && exit "$FAKE_EXIT"
trap 'exit $FAKE_EXIT_ON_SIGNAL' USR1 TERM
touch "$FAKE_DIR/started"
while true; do sleep 0.05; done
""",
}


def run_with_fakes(tmp_path, send=None, **env_extra):
    """Run the script as sbatch would on a 32-CPU node with 8 processes; returns (exit code, output, scontrol log)."""
    fakes = tmp_path / "bin"
    fakes.mkdir(exist_ok=True)
    for name, text in FAKES.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTRAIN_", "OMP_"))}
    env.update(PATH=f"{fakes}{os.pathsep}{env['PATH']}", FAKE_DIR=str(tmp_path), SLURM_JOB_ID="4242",
               SLURM_CPUS_PER_TASK="32", SLURM_NNODES="1", BERTRAIN_PROCS_PER_NODE="8",
               BERTRAIN_PYTHON=str(fakes / "python"), BERTRAIN_RUN_DIR=str(tmp_path / "run"), **env_extra)
    job = subprocess.Popen(["bash", str(SBATCH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    if send is not None:
        deadline = time.time() + 30
        while not (tmp_path / "started").exists():
            assert time.time() < deadline and job.poll() is None, "the fake training never started"
            time.sleep(0.05)
        job.send_signal(send)
    out, _ = job.communicate(timeout=60)
    scontrol = tmp_path / "scontrol"  # its log
    return job.returncode, out, scontrol.read_text() if scontrol.exists() else ""


@pytest.mark.parametrize("send, exit_code, requeued", [
    (signal.SIGUSR1, 75, True),   # the time limit: checkpoint written, requeue
    (signal.SIGUSR1, 1, False),   # the save failed after USR1 (disk full): the job ends with the error
    (signal.SIGTERM, 75, False),  # scancel (or preemption): checkpoint, then stop for good
])
def test_requeue_only_after_the_requeue_code_and_never_after_term(tmp_path, send, exit_code, requeued):
    code, out, scontrol = run_with_fakes(tmp_path, send, FAKE_EXIT_ON_SIGNAL=str(exit_code))
    assert f"received SIG{send.name[3:]}" in out and f"training step exited with status {exit_code}" in out
    assert (scontrol == "requeue 4242\n") is requeued, out
    assert code == (0 if requeued else exit_code), out
    assert ("not requeueing" in out) is (send == signal.SIGTERM)


def test_exit_codes_without_a_signal_and_the_cpu_settings(tmp_path):
    code, out, scontrol = run_with_fakes(tmp_path, FAKE_EXIT="75", BERTRAIN_MIXED_PRECISION="fp16")
    assert code == 0 and scontrol == "requeue 4242\n", out  # the processes stopped by a signal of their own
    assert (tmp_path / "omp").read_text() == "4\n"  # 32 CPUs shared by 8 processes, not 32 threads each
    assert "--cpus-per-task=32" in (tmp_path / "srun_args").read_text().split()
    args = (tmp_path / "python_args").read_text().split()
    assert args[args.index("--set") + 1] == "train.mixed_precision=fp16"
    assert args[args.index("--mixed_precision") + 1] == "no"  # accelerate launch's flag is not the one used
    (tmp_path / "scontrol").unlink()
    code, out, scontrol = run_with_fakes(tmp_path, FAKE_EXIT="2")  # a bad config
    assert code == 2 and scontrol == "", out
    assert "train.mixed_precision" not in (tmp_path / "python_args").read_text()  # the config's own


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.multiprocess
def test_preempted_job_is_requeued_and_finishes_like_an_uninterrupted_run(tmp_path):
    reason = slurm_ready()
    if reason:
        pytest.skip(reason)
    data = make_prepared_dir(tmp_path / "data", kind="wordpiece", num_documents=120)
    config = write_config(tmp_path / "slurm.yaml", train={"max_steps": STEPS, "save_every": 4, "eval_every": 6})

    reference = tmp_path / "reference"
    result = run_pretrain(config, data, reference, nproc=2)
    assert result.returncode == 0, explain(result)

    run_dir, log = tmp_path / "slurm_run", tmp_path / "job.out"
    env = pretrain_env(BERTRAIN_CONFIG=str(config), BERTRAIN_DATA=str(data), BERTRAIN_RUN_DIR=str(run_dir),
                       BERTRAIN_PYTHON=sys.executable, BERTRAIN_PROCS_PER_NODE="2",  # the config's precision
                       BERTRAIN_PORT=str(29700 + (int(time.time()) % 200)),
                       BERTRAIN_TEST_STEP_DELAY="0.3")  # slow steps so the signal lands mid-run
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2", "--time=15",
         f"--output={log}", f"--chdir={tmp_path}", str(SBATCH)],
        env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.time() + 180
        while time.time() < deadline:  # wait for a few steps of training
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and sum(1 for line in metrics.read_text().splitlines()
                                         if '"train"' in line) >= 3:
                break
            assert job_field(job, "JobState") in ("PENDING", "RUNNING", "CONFIGURING"), log.read_text()
            time.sleep(0.5)
        else:
            pytest.fail(f"job {job} did not start training:\n{log.read_text() if log.exists() else ''}")
        # What `#SBATCH --signal=B:USR1@120` does near the time limit, now.
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, timeout=30)

        deadline = time.time() + 400  # requeued jobs wait cred_expire (10 s in our test cluster)
        while time.time() < deadline:
            state = job_field(job, "JobState")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                break
            time.sleep(2)
        text = log.read_text()
        assert state == "COMPLETED", f"job {job} ended {state}:\n{text[-5000:]}"
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)

    assert job_field(job, "Restarts") == "1"
    assert "received SIGUSR1" in text and f"requeueing job {job}" in text and "(restart 1)" in text
    resumed = re.search(r"Resuming from \S+step-(\d+)", " ".join(text.split()))
    assert resumed and 0 < int(resumed.group(1)) < STEPS, text[-3000:]
    ours, theirs = train_losses(run_dir), train_losses(reference)
    assert sorted(ours) == list(range(1, STEPS + 1))
    assert ours == theirs  # every step, including the final loss, bit for bit
    assert_same_weights(final_weights(run_dir, STEPS), final_weights(reference, STEPS))
    state = json.loads((run_dir / "checkpoints" / f"step-{STEPS:08d}" / "train_state.json").read_text())
    assert state["step"] == STEPS and state["world_size"] == 2

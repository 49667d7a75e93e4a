"""The demo's stages run as children that get each stop signal exactly once, from the demo (audit 4: a SIGTERM to
the demo's pid killed it and left its pretrain stage training as an orphan)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT

# The stage: counts the stop signals it gets for half a second after the first, then exits 70 + that count.
CHILD = """
import pathlib, signal, sys, time
got = []
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, lambda signum, frame: got.append(signum))
pathlib.Path(sys.argv[1]).write_text("ready")
while not got:
    time.sleep(0.01)
time.sleep(0.5)  # a second delivery (the group's and the parent's) would be counted
sys.exit(70 + len(got))
"""
PARENT = """
import signal, sys
from bertrain.child_process import run_forwarding_signals
print("stage exit", run_forwarding_signals([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                                           (signal.SIGINT, signal.SIGTERM)), flush=True)
"""


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("to_group", [False, True])
def test_a_stop_signal_reaches_the_stage_once_and_the_parent_waits_for_it(tmp_path, number, to_group):
    marker = tmp_path / "ready"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()
        time.sleep(0.02)
    # `kill PID` of the parent alone, or the whole group as a scheduler or the terminal's Ctrl-C sends it.
    (os.killpg if to_group else os.kill)(parent.pid, number)
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 0 and out.strip() == "stage exit 71", (out, err)


def test_a_stage_whose_parent_is_killed_9_is_stopped_not_orphaned(tmp_path):
    marker, got = tmp_path / "ready", tmp_path / "got"
    child = (CHILD.replace("sys.exit(70 + len(got))", "pathlib.Path(sys.argv[2]).write_text(str(got)); sys.exit(0)")
             .replace("time.sleep(0.5)  # a second delivery (the group's and the parent's) would be counted", ""))
    parent = subprocess.Popen([sys.executable, "-c", PARENT.replace("sys.argv[2]]", "sys.argv[2], sys.argv[3]]"),
                               child, str(marker), str(got)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()
        time.sleep(0.02)
    parent.kill()  # kill -9 of the demo: its stage was left training
    parent.communicate(timeout=120)
    while not got.exists():
        assert time.monotonic() < deadline, "the stage was not told its parent died"
        time.sleep(0.02)
    assert got.read_text() == f"[{int(signal.SIGTERM)}]"

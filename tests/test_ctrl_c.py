"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during `bertrain prepare`: one line saying how
far it got and how to resume, exit 130, no traceback from the pool's workers; the same command then finishes with the
output of an uninterrupted run. (Ctrl-C during pretrain: tests/test_resume.py; under `bertrain launch`:
tests/test_launch.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from bertrain.data.format import open_prepared
from bertrain.data.prepare import shards as shards_module
from bertrain.data.sources.pydoc import write_pydoc_corpus
from tests.helpers import ROOT, default_ctrl_c, pretrain_env, wait_for_file

WAIT = 300  # seconds: generous, for a loaded machine; no test measures time
PAUSED_SHARD = "shard-00002"
real_tokenize_shard = shards_module.tokenize_shard


def tokenize_shard_pausing(*args):
    """tokenize_shard, except that PAUSED_SHARD (args[2]) writes $PAUSE_MARKER and then never finishes: the test
    presses Ctrl-C while one worker is inside it. Imported by name in the spawned workers."""
    if args[2] == PAUSED_SHARD and os.environ.get("PAUSE_MARKER"):
        Path(os.environ["PAUSE_MARKER"]).write_text(str(os.getpid()))
        time.sleep(WAIT)
    return real_tokenize_shard(*args)


# `bertrain prepare` with tokenize_shard replaced in the main process (the pool's tasks name it from there).
PREPARE = ("import sys\n"
           "from bertrain.data.prepare import shards\n"
           "from tests.test_ctrl_c import tokenize_shard_pausing\n"
           "shards.tokenize_shard = tokenize_shard_pausing\n"
           "from bertrain.cli import entry\n"
           "sys.argv[0] = 'bertrain'\n"
           "entry()\n")


def prepare_command(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", PREPARE, "prepare", "--recipe", "pydoc", "--source", str(corpus), "--out", str(out),
            "--vocab-size", "400", "--num-shards", "4", "--workers", "2"]


def assert_resumes_like_a_fresh_run(tmp_path: Path, corpus: Path) -> None:
    """The same prepare command again in tmp_path/data finishes, with the fingerprint of an uninterrupted run."""
    again = subprocess.run(prepare_command(corpus, tmp_path / "data"), cwd=ROOT, text=True, env=pretrain_env(),
                           capture_output=True, timeout=WAIT)
    assert again.returncode == 0, again.stderr
    fresh = subprocess.run(prepare_command(corpus, tmp_path / "fresh"), cwd=ROOT, text=True, env=pretrain_env(),
                           capture_output=True, timeout=WAIT)
    assert fresh.returncode == 0, fresh.stderr
    assert open_prepared(tmp_path / "data").fingerprint == open_prepared(tmp_path / "fresh").fingerprint


def test_ctrl_c_during_prepare_says_how_to_resume_in_one_line_and_resumes(tmp_path):
    corpus = tmp_path / "pydoc"
    write_pydoc_corpus(corpus)
    marker = tmp_path / "paused"
    process = subprocess.Popen(prepare_command(corpus, tmp_path / "data"), cwd=ROOT, text=True,
                               env=pretrain_env(PAUSE_MARKER=str(marker)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_ctrl_c)
    wait_for_file(marker, process, WAIT)  # prepare reached the paused shard
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: prepare, its workers and multiprocessing's helper
    out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 130, f"{out}\n{err}"
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out, err
    lines = [line for line in err.splitlines() if "run the same command again to resume" in line]
    assert len(lines) == 1, err
    done = re.fullmatch(r"prepare interrupted; (\d) of 5 shards done; run the same command again to resume\.",
                        lines[0].strip())
    assert done and int(done[1]) < 5, lines  # 4 train shards and 1 validation shard; the paused one is not done
    assert not (tmp_path / "data" / "manifest.json").exists()

    assert_resumes_like_a_fresh_run(tmp_path, corpus)

"""benchmarks/gpu_suite.sh, the one command for every GPU figure (issue 25): its GPU commands' configs load, its
report renders every GPU section, its sync counter sees reads, and `--device cpu --quick` runs the same
commands to the end with `datasets` and `wandb` hidden (as on the bare GPU machine) into a full report."""

from __future__ import annotations

import ast
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HAS_TRITON = importlib.util.find_spec("triton") is not None
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_checks  # noqa: E402
import gpu_report  # noqa: E402
import gpu_suite  # noqa: E402
import loader_transfer  # noqa: E402
from gpu_step import model_config  # noqa: E402

from bertrain.config import load_config  # noqa: E402
from bertrain.train.setup import COMPILE_MIN_STEPS  # noqa: E402

# sitecustomize for a PYTHONPATH entry: `datasets` and `wandb` cannot be found (find_spec gives None, as where
# they are not installed, so transformers and accelerate see them as absent) and cannot be imported.
HIDE = '''import sys
HIDDEN = {"datasets", "wandb"}
class Hidden:
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, name):
        return getattr(self.finder, name)
sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
'''
LOGS = ["checks.log", "compile.log", "pretrain.log", "setup.log", "step.log"]


def sets_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]


def test_the_gpu_commands_configs_load_and_fit_the_budget(tmp_path):
    """The configs of every GPU command (with their --set overrides) pass validation: no typo waits for a GPU;
    the plan runs the parts by importance and, as planned, leaves torch.compile the time it needs."""
    commands = gpu_suite.plan("cuda", False, tmp_path)
    assert [c.part for c in commands] == ["0"] * 4 + ["1"] + ["2"] * 4 + ["3", "4", "6", "7", "5", "5", "5", "2",
                                                                          "7", "2", "4"]
    assert [c.label for c in commands[-7:]] == ["gpu_step-compile", "bert_large-128-compile",
                                                gpu_suite.COMPILE_WITH_WORKERS, gpu_suite.WITH_WORKERS,
                                                "profile-compile", "loader-transfer", "lamb-kernels"]
    assert sum(c.floor for c in commands) < gpu_suite.BUDGET_S - 60  # every part keeps time of its own
    before_compile = sum(c.expect for c in commands[:-7]) + 10  # + the version probe
    assert all(c.optional for c in commands[-7:]) and not any(c.optional for c in commands[:-7])
    assert gpu_suite.BUDGET_S - before_compile >= max(150, commands[-7].min_start)
    by_label = {c.label: c for c in commands}

    def but_steps(command) -> list[str]:
        return [s for s in sets_of(command.argv) if not s.startswith(("train.max_steps=", "train.log_every="))]

    # the loop A/Bs, eager and compiled: the same run but for 4 loader workers
    for default, with_workers in (("bert_large-128", gpu_suite.WITH_WORKERS),
                                  ("bert_large-128-compile", gpu_suite.COMPILE_WITH_WORKERS)):
        default, with_workers = by_label[default], by_label[with_workers]
        with warnings.catch_warnings():  # the warmup longer than the run: the configs' check below expects it
            warnings.simplefilter("ignore")
            loaded = [load_config("bert_large", sets_of(c.argv)) for c in (default, with_workers)]
        assert [c.data.num_workers for c in loaded] == ["auto", 4] and loaded[0].model == loaded[1].model
        assert but_steps(with_workers) == but_steps(default) + ["data.num_workers=4"]
        assert loaded[0].train.compile == loaded[1].train.compile and "--profile" not in with_workers.argv
    # the loops are marked, then profiled, each in a window of its own after their measured steps (a loop profiled
    # earlier stays slower), and the compiled bare step too
    for label, measured_end in (("bert_large-128", 300), ("bert_large-128-compile", 80)):
        argv = [str(a) for a in by_label[label].argv]
        marked, marked_count = map(int, argv[argv.index("--marks") + 1].split(":"))
        start, count = map(int, argv[argv.index("--profile") + 1].split(":"))
        config = load_config("bert_large", sets_of(argv))
        assert marked == measured_end and start == marked + marked_count
        assert start + count <= config.train.max_steps <= start + count + config.train.log_every
        assert measured_end % config.train.log_every == 0 and "--bare-steps" in argv
    argv = by_label["profile-compile"].argv
    assert "--compile" in argv and str(argv[argv.index("--results") + 1]).endswith("7-compile.jsonl")
    for command in commands:
        argv = [str(a) for a in command.argv]
        assert (gpu_suite.TIME_LIMIT in argv) == (command.grace > 0) == ("gpu_pretrain.py" in " ".join(argv))
        if "--config" in argv:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                config = load_config(argv[argv.index("--config") + 1], sets_of(argv))
            assert config.model.max_position_embeddings >= config.data.max_seq_length
            # the one warning expected: a throughput run of a few hundred steps never ends its config's warmup
            messages = [str(w.message) for w in caught]
            assert all(message.startswith("optim.warmup_steps") for message in messages), messages
            # part 2 times the eager loop and part 5 the compiled one: train.compile auto must not decide for them
            assert command.grace == 0 or config.train.compile is ("compile" in command.label) or (
                config.train.compile == "auto" and config.train.max_steps < COMPILE_MIN_STEPS), command.label
    prepare = next(c for c in commands if c.label == "prepare-synthetic")
    assert "--tokenizer" in prepare.argv and "--workers" in prepare.argv  # no tokenizer training, every core
    for shape in ("bert-base", "bert-large", "albert-base", "albert-large"):
        for seq in (128, 512):
            assert model_config(shape, seq).max_position_embeddings >= seq
    sync = next(c for c in commands if c.label == "sync")
    args = gpu_checks.parse_args([str(a) for a in sync.argv[2:]])
    for case in args.case:
        name, optimizer = case.split(":")
        for unpad in ("false", "true"):
            assert load_config(name, gpu_checks.sync_overrides(optimizer, unpad, args)).optim.name == optimizer


def test_only_an_optional_command_may_run_out_of_time(tmp_path):
    commands = gpu_suite.plan("cuda", False, tmp_path)
    for command in commands:
        command.status = "ok"
    commands[-1].status = f"{gpu_suite.TIME_BUDGET}: 20 s left, 25 s needed"  # LAMB's kernel configurations
    commands[-2].status = f"{gpu_suite.TIME_BUDGET}: 20 s left, 30 s needed"  # taking a batch from workers
    commands[-3].status = f"{gpu_suite.TIME_BUDGET}: 20 s left, 25 s needed"  # the compiled step's profile
    commands[-4].status = f"{gpu_suite.TIME_BUDGET}: 20 s left, 45 s needed"  # the per-weight-casts loop
    commands[-5].status = f"{gpu_suite.TIME_BUDGET}: 20 s left, 45 s needed"  # the loop with loader workers
    commands[-6].status = f"{gpu_suite.TIME_BUDGET}: 40 s left, 100 s needed"  # the compiled loop
    assert not gpu_suite.suite_failed({}, commands)
    commands[-7].status = "timed out after 170 s"  # the compiled bare step: optional too
    assert not gpu_suite.suite_failed({}, commands)
    commands[-8].status = "timed out after 45 s"  # part 7's eager profile is not optional
    assert gpu_suite.suite_failed({}, commands)
    commands[-8].status, commands[-1].status = "ok", "failed (exit 1)"  # optional, but it ran and failed
    assert gpu_suite.suite_failed({}, commands)


def test_a_command_past_its_timeout_is_stopped_with_its_children_and_named(tmp_path):
    """A hung part costs its own timeout only: its process group is stopped, its status and output kept."""
    script = "import subprocess, sys; print('started', flush=True); subprocess.run(['sleep', '60'])"
    command = gpu_suite.Command("1", "hangs", [sys.executable, "-c", script], cap=1, floor=0, expect=0, log="step.log")
    gpu_suite.run_command(command, tmp_path, timeout=2, env=dict(os.environ))
    assert command.status == "timed out after 2 s" and command.seconds < 10 and "started" in command.tail
    assert "===== hangs: timed out after 2 s" in (tmp_path / "step.log").read_text()


def test_the_sync_counter_names_each_host_read():
    t = torch.tensor([1.0, 2.0])
    with gpu_checks.counting_syncs(torch.device("cpu")) as found:
        t.sum().item()
        t[t > 1]
        t[0], t[1:]  # plain indexing reads nothing
    assert sum(found.values()) == 2 and all(where.startswith("tests/test_gpu_suite.py:") for where in found)


def test_a_sync_warning_is_charged_to_the_code_that_called_torch():
    """torch's sync warning carries torch's own file and line: the counter names the caller's instead, and the
    bertrain frame when the caller is another package."""
    found = collections.Counter()
    with gpu_checks.recording_sync_warnings(found):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
        warnings.warn("an unrelated warning", UserWarning)
    assert list(found) == [f"tests/test_gpu_suite.py:{sys._getframe().f_lineno - 2} (sync)"]
    torch_file = str(Path(torch.__file__).resolve().parent / "cuda" / "__init__.py")
    frames = [traceback.FrameSummary(path, line, "f", lookup_line=False) for path, line in (
        (f"{ROOT}/bertrain/train/step.py", 88), ("/venv/lib/site-packages/accelerate/optimizer.py", 170),
        (torch_file, 1270))]
    assert gpu_checks.sync_site(frames, "sync") == \
        "accelerate/optimizer.py:170, from bertrain/train/step.py:88 (sync in torch/cuda/__init__.py:1270)"
    assert gpu_checks.sync_site(frames[:1] + frames[2:], "raised") == \
        "bertrain/train/step.py:88 (raised in torch/cuda/__init__.py:1270)"


def table_rows(report: str, heading: str) -> list[list[str]]:
    """The cells of the table rows (headers and rules left out) in the section starting with `heading`."""
    lines = report.split(heading)[1].split("\n## ")[0].splitlines()
    rows = [line.strip("|").split(" | ") for line, after in zip(lines, lines[1:] + [""])
            if line.startswith("| ") and not after.startswith("|---")]
    return [[cell.strip() for cell in row] for row in rows]


def fake_gpu_results(runs: list[dict]) -> dict:
    """Figures shaped as the GPU run writes them, for every row the report expects."""
    step = [dict(shape=shape, seq=seq, batch=32, dtype="bf16", ours=0.05, hf=0.07, peak=6.6e14, flops=1.5e13,
                 per_weight_casts=0.0525) for shape in ("bert-base", "bert-large", "albert-base", "albert-large")
            for seq in (128, 512)]
    pretrain = [dict(label=run["label"], exit_code=0, steps_run=run["steps"], measured_steps=run["last"],
                     tokens_per_s=5e5, samples_per_s=4e3, step_ms=60.0, useful_mfu=0.4, peak_flops=7.26e14,
                     data_wait_share=0.01, host_train_step_ms_median=54.0,
                     padding_share=0.05, computed_padding_share=0.05, peak_memory_gb=30.0, wall_s=50.0,
                     first_step_s=2.0, compiled_graphs=1, graph_breaks=0, time_limited=False,
                     loader_workers=0) for run in runs]
    sync = [dict(case=f"bert_base+adamw, unpad {u}", first_step=1, later_steps=0, steps=4, error_mode="passed",
                 where={"x.py:1": 1}, method="sync debug mode") for u in ("false", "true")]
    # the loops with loader workers: the host 48 ms of their 60 ms step, 0.2% of their time waiting for data
    for r in pretrain:
        if r["label"] in (gpu_suite.WITH_WORKERS, gpu_suite.COMPILE_WITH_WORKERS):
            r.update(loader_workers=4, host_train_step_ms_median=48.0, data_wait_share=0.002)
    # bert_large-128's loop against the bare step on its own last batches: 290.4 T against 300 T
    pretrain[1]["bare_same_batches"] = dict(steps=24, first_micro_batch=276, rounds=3, step_ms=58.0,
                                            real_tokens=300_000, run_tokens=300_000, tokens_per_s=5.2e5,
                                            useful_flops_per_s=3e14, precision="bf16")
    # bert_large-128's marked loop steps and the bare step's on its batches (host ms from the step's start, leads)
    def marked(points: list[tuple[str, float, float]]) -> dict:
        return dict(steps=6, first=302, points=[dict(point=name, host_ms=host, device_ms=host + lead, lead_ms=lead,
                                                     lowest_lead_ms=lead / 2) for name, host, lead in points])
    pretrain[1]["marks"] = marked([("step start", 0.0, 0.3), ("batch taken", 2.0, 0.4), ("forward queued", 22.0, 0.5),
                                   ("backward end", 50.0, 0.8), ("norm end", 51.0, 0.01), ("train_step end", 52.0, 0.3),
                                   ("optimizer start", 52.5, 0.3), ("optimizer end", 58.0, 0.2),
                                   ("step end", 60.0, 0.3)])
    pretrain[1]["bare_same_batches"]["marks"] = marked([("step start", 0.0, 0.5), ("forward end", 18.0, 1.0),
                                                        ("backward end", 45.0, 1.2), ("optimizer end", 54.8, 0.6),
                                                        ("step end", 55.0, 0.5)])
    # bert_large-128's profiled loop steps: 56 ms of device time in its 60 ms step, clipping among it
    pretrain[1]["profile"] = dict(steps=[301, 303], tokens=12_800.0, total_ms=56.0,
                                  groups_ms={"GEMM": 28.16, "other": 27.84},
                                  ops_ms={"aten::mm": 28.16, "aten::_foreach_norm": 2.56, "aten::add": 25.28},
                                  gaps=dict(steps=3, span_ms=59.0, busy_ms=56.0, idle_ms=3.0, host_late_ms=2.25,
                                            queued_ms=0.5, short_ms=0.25, min_gap_us=2.0, lead_p10_ms=0.012,
                                            lead_p50_ms=1.5,
                                            late_ops=[dict(op="aten::linear", ms=1.5, gaps=24.0),
                                                      dict(op="(no op)", ms=0.75, gaps=1.0)]))
    # bert_large-128-compile's: 44 ms of device time in its 60 ms step
    compiled_loop = next(r for r in pretrain if r["label"] == "bert_large-128-compile")
    # against the compiled bare step on its own last batches: 290.4 T against 330 T
    compiled_loop["bare_same_batches"] = dict(pretrain[1]["bare_same_batches"], step_ms=50.0, useful_flops_per_s=3.3e14)
    compiled_loop["profile"] = dict(steps=[81, 83], tokens=12_800.0, total_ms=44.0,
                                    groups_ms={"GEMM": 28.16, "normalization": 15.84},
                                    ops_ms={"aten::mm": 28.16, "triton_per_fused_native_layer_norm_0": 15.84},
                                    gaps=dict(steps=3, span_ms=58.0, busy_ms=44.0, idle_ms=14.0, host_late_ms=13.0,
                                              queued_ms=1.0, short_ms=0.0, min_gap_us=2.0,
                                              late_ops=[dict(op="CompiledFunction", ms=12.0, gaps=48.0)]))
    eager = [r for r in pretrain if "compile" not in r["label"]]
    return {"1": step, "2": eager,
            "3": sync + [dict(case="albert_base:lamb, unpad false", error="OOM")],
            "4": [dict(config="bert_base", parameters=1.1e8, adamw_ms=3.0, fused_adamw_ms=2.9, lamb_ms=3.5, ratio=1.17,
                       adamw_host_ms=1.2, fused_adamw_host_ms=0.7, lamb_host_ms=2.0,
                       clip_in_place_ms=3.5, clip_scale_ms=3.1, lamb_clip_in_place_ms=4.0, lamb_clip_scale_ms=3.6)],
            # the best configuration measured with the host ahead: 1.12x (the 1.05x one was host-bound)
            "4-kernels": [dict(config=name, parameters_of="bert_base", device_ms=ratio, device_ratio=ratio, wall_ms=1.5,
                               wall_ratio=1.5, vs_default=0.0, host_ahead=ahead, **same)
                          for name, ratio, ahead, same in (("two_pass 4096x8", 1.36, True, {}),
                                                           ("pipelined 4096x8, 8 MB groups", 1.12, True,
                                                            dict(same_as_two_pass=True)),
                                                           ("pipelined 2048x8, 4 MB groups", 1.05, False,
                                                            dict(same_as_two_pass=False)))]
            + [dict(config="two_pass 1024x4", parameters_of="bert_base", error="did not build")],
            "5": [r for r in pretrain if r not in eager],
            "5-step": [dict(r, compiled=True, compile_s=40.0, ours=0.04) for r in step
                       if (r["shape"], r["seq"]) in gpu_suite.STEP_COMPILE_SHAPES],
            "7": [dict(shape="bert-large", seq=128, batch=128, total_ms=40.96,
                       groups_ms={"GEMM": 32.768, "other": 8.192}, ops_ms={"aten::mm": 32.768, "aten::add": 8.192},
                       gaps=dict(steps=3, span_ms=42.0, busy_ms=40.96, idle_ms=1.04, host_late_ms=0.84, queued_ms=0.2,
                                 short_ms=0.0, min_gap_us=2.0, late_ops=[]))],
            "7-compile": [dict(shape="bert-large", seq=128, batch=128, compiled=True, total_ms=36.864,
                               groups_ms={"GEMM": 32.768, "normalization": 4.096},
                               ops_ms={"aten::mm": 32.768, "triton_per_fused_native_layer_norm_0": 4.096})]}


def test_the_report_renders_every_gpu_section(tmp_path):
    commands = gpu_suite.plan("cuda", False, tmp_path)
    for command in commands:
        command.status, command.tail = "ok", "PASS"
    next(c for c in commands if c.label == "bert_large-128-compile").status = "timed out after 150 s"
    runs = gpu_suite.pretrain_runs(False)
    info = dict(gpu="NVIDIA H100 80GB HBM3", gpu_memory_gb=79.2, torch="2.11.0", cuda="13.0", driver="580.159.04",
                triton="3.6.0")
    state = dict(device="cuda", quick=False, out="o", scratch="s", argv="bash benchmarks/gpu_suite.sh o", runs=runs,
                 roles=gpu_suite.target_shapes(False), step_shapes=gpu_suite.step_shapes(False), info=info)
    report = gpu_report.render(state, commands, fake_gpu_results(runs))
    assert "failed to render" not in report and "no figure" not in report
    assert report.splitlines()[2] == "- GPU: NVIDIA H100 80GB HBM3 (79 GiB)"
    assert "Triton 3.6.0, Python" in report
    assert "CUDA 13.0, driver 580.159.04" in report and "**bert_large-128-compile: timed out after 150 s**" in report
    assert "**Taking a batch**" in report.split("## 2.")[1].split("## 3.")[0]  # loader_transfer.py's table
    assert len(table_rows(report, "## 1.")) == 8
    # one cast per layer against per-weight casts (0.0525 / 0.05)
    assert {row[-1] for row in table_rows(report, "## 1.")} == {"1.050x"}
    # vs bare, in FLOP/s: 0.4 x 7.26e14 = 290.4 T against part 1's 1.5e13 / 0.05 s = 300 T x (1 - 0.05 padding
    # computed) = 285 T: 1.02 (the MFUs, 0.4 against 0.4545 x 0.95, would say 0.93: their GEMM peaks differ by 10%)
    assert {tuple(row[7:11]) for row in table_rows(report, "## 2.")} == {("290.4", "5.0% / 5.0%", "285.0", "1.02")}
    # against the bare step on its own batches: 290.4 T / 300 T; only bert_large-128 measures it
    assert [row[11] for row in table_rows(report, "## 2.")] == ["n/a", "0.97"] + ["n/a"] * 3
    assert "bert_large-128: the bare step on the run's last 24 batches ran 300.0 useful TFLOP/s (58.0 ms a step), " \
           "1.00x part 1's 300.0 on unpadded batches; the loop ran 0.97x the former." in report
    assert [row[13] for row in table_rows(report, "## 2.")] == ["0"] * 4 + ["4"]  # the runs' loader workers
    assert "bert_large's loop with 4 loader workers (the training thread pins their batches) against 0 " \
           "(`data.num_workers: auto`): vs bare 1.02 against 1.02, host in step 0.80 against 0.90, data wait " \
           "0.2% against 1.0%." in report
    assert [row[14] for row in table_rows(report, "## 2.")] == ["0.90"] * 4 + ["0.80"]  # host 54 ms of 60
    # the compiled loop (290.4 T) against the compiled bare step: 1.5e13 / 0.04 s x (1 - 0.05 computed) = 356.25 T:
    # 0.82; against the compiled bare step on its own batches (330 T): 0.88; the eager loop's row has neither
    loops = table_rows(report, "## 5.")[:3]
    assert [(row[0], row[4], row[-3], row[-2], row[-1]) for row in loops] == [
        ("eager (part 2's bert_large-128)", "1.0%", "0", "", ""),
        ("train.compile=true, 0 loader workers", "1.0%", "0", "0.82", "0.88"),
        ("train.compile=true, 4 loader workers", "0.2%", "0", "0.82", "n/a")]
    assert "bert_large-128-compile: the compiled bare step on the run's last 24 measured batches ran 330.0 useful " \
           "TFLOP/s (50.0 ms a step); the loop ran 0.88x that." in report
    assert "The compiled loop with 4 loader workers (the training thread pins their batches) against 0 " \
           "(`data.num_workers: auto`): vs compiled bare 0.82 against 0.82, host in step 0.80 against 0.90" in report
    # the compiled step: 0.05 s eager, 0.04 s compiled (1.25x); vs transformers 0.07 / 0.04 = 1.75x
    assert [row[6:] for row in table_rows(report, "## 5.")[3:]] == [["1.25x", "56.8%", "1.75x"]] * 2
    verdicts = [row[-1] for row in table_rows(report, "## 8.")]
    assert len(verdicts) == 2 + 2 + 2 + 4 + 2 + 1 + 2 + 3 + 2 + 1 and verdicts.count("not measured") == 1  # failed
    judged = {row[0]: row[1:] for row in table_rows(report, "## 8.")}
    assert judged["pretrain bert_large-128: within 10% of the bare step on the run's own batches (vs bare, its "
                  "batches >= 0.9, part 2)"] == ["0.97", "met"]
    assert judged["pretrain bert_large-128-compile (train.compile, part 5): within 10% of the compiled bare step"] \
        == ["0.82", "**NOT met**"]
    assert judged["pretrain bert_large-128-compile (train.compile, part 5): within 10% of the compiled bare step on "
                  "the run's own batches"] == ["0.88", "**NOT met**"]
    assert [row[0] for row in table_rows(report, "## 8.")[2:4]] == [
        "bert-large seq 128 (train.compile, part 5): useful MFU >= 50%",
        "bert-large seq 128 (train.compile, part 5): >= 1.5x transformers"]
    assert set(verdicts) == {"met", "**NOT met**", "not measured"}
    lamb = {row[0]: row[1:] for row in table_rows(report, "## 8.")}
    assert lamb["LAMB <= 1.3x fused AdamW, device time (host ahead), best kernel configuration"] == [
        "1.12x (pipelined 4096x8, 8 MB groups)", "met"]
    assert table_rows(report, "## 4.")[0][-1] == "3.50 / 3.10; 4.00 / 3.60"  # clipped in place / as grad_scale
    assert [table_rows(report, "## 4.")[0][i] for i in (4, 7, 8)] == ["3.00 / 2.90", "1.17x", "1.20 / 0.70 / 2.00"]
    kernels = table_rows(report, "**LAMB's kernel configurations**")
    assert [(row[0], row[6], row[7]) for row in kernels] == [("two_pass 4096x8", "", "yes"), (
        "pipelined 4096x8, 8 MB groups", "bitwise", "yes"), ("pipelined 2048x8, 4 MB groups", "**differ**",
                                                          "no: host-bound"), ("two_pass 1024x4", "", "")]
    assert kernels[-1][1] == "**did not build**"
    # per 1M real tokens: GEMM 28.16 ms / 12,800 tokens = 2,200.0 against 32.768 / 16,384 = 2,000.0; the loop's
    # clipping has no bare counterpart; steps: 60 ms (part 2) and 50 ms (part 1's 0.05 s), less the ops' time
    # bert_large-128's marked loop: each segment's host ms and the lead at its end, the bare step's beside the
    # segments that end the same work; the device waited at the norm (lead 0.01)
    segments = {row[0]: row[1:] for row in table_rows(report, "**bert_large-128: the host's time in each part")}
    assert segments["forward queued"] == ["20.000", "0.500", "0.250", "18.000", "1.000"], segments
    assert segments["norm end"] == ["1.000", "0.010", "0.005", "n/a", "n/a"]
    assert segments["whole step"] == ["60.000", "", "", "55.000", ""] and "batch taken" in segments
    eager_part = report.split("**The compiled loop's step")[0]
    loop = {row[0]: row[1:] for row in table_rows(eager_part, "**The loop's step against the bare step.**")}
    assert loop["GEMM"] == ["28.16", "32.77", "2200.0", "2000.0", "+200.0"]
    assert loop["all ops"] == ["56.00", "40.96", "4375.0", "2500.0", "+1875.0"]
    assert loop["step (measured)"] == ["60.00", "50.00", "4687.5", "3051.8", "+1635.7"]
    assert loop["device idle (step - ops)"] == ["4.00", "9.04", "312.5", "551.8", "-239.3"]
    assert loop["`aten::_foreach_norm`"] == ["2.56", "0.00", "200.0", "0.0", "+200.0"]
    assert "steps 301-303" in report and "12,800 real tokens a step" in report
    # where the bare step's device waited: no late op to list
    bare_waited = eager_part.split("**Where the bare step's (3 steps after a sync, as part 1 times them) device "
                                   "waited**")[1].split("**The loop's step")[0]
    assert "idle 1.04: **0.84 where the host launched" in bare_waited and "outermost op" not in bare_waited
    # where its device waited (trace_gaps.py): the idle split, then the host ops that launched late
    waited = eager_part.split("**Where the loop's device waited**")[1]
    assert "busy 56.00 of 59.00, idle 3.00: **2.25 where the host launched" in waited
    assert "0.50 with the kernel queued but waiting" in waited and "0.25 in gaps under 2 us" in waited
    assert "a median 1.500 ms before it started (10th percentile 0.012 ms)" in waited
    assert "median" not in bare_waited  # a trace without launch figures: no such sentence
    assert table_rows(eager_part, "The host's outermost op at each late launch") == [
        ["`aten::linear`", "1.500", "24.0"], ["`(no op)`", "0.750", "1.0"]]
    # compiled: normalization 15.84 ms / 12,800 = 1,237.5 against 4.096 / 16,384 = 250.0; steps: 60 ms (part 5)
    # and 40 ms (part 5's compiled bare step, 0.04 s), less the ops' time
    compiled = {row[0]: row[1:] for row in table_rows(
        report, "**The compiled loop's step against the compiled bare step.**")}
    assert compiled["normalization"] == ["15.84", "4.10", "1237.5", "250.0", "+987.5"]
    assert compiled["device idle (step - ops)"] == ["16.00", "3.14", "1250.0", "191.4", "+1058.6"]
    assert compiled["`triton_per_fused_native_layer_norm_0`"][0] == "15.84" and "loop steps 81-83" in report
    compiled_part = report.split("**The compiled loop's step")[1].split("**bert_large-128: the host's time")[0]
    assert "**Where the compiled loop's device waited**" in compiled_part
    assert "idle 14.00: **13.00 where" in compiled_part
    assert "compiled bare step's device waited" not in compiled_part  # its profile has no trace figures here
    assert table_rows(compiled_part, "The host's outermost op at each late launch") == [
        ["`CompiledFunction`", "12.000", "48.0"]]


def test_the_packed_attention_benchmark_runs_every_variant_on_a_cpu():
    """benchmarks/gpu_packed.py (run by hand on a GPU): every variant steps, the three paths' losses agree."""
    result = subprocess.run([sys.executable, "gpu_packed.py", "--device", "cpu", "--shape", "tiny", "--steps", "1"],
                            cwd=ROOT / "benchmarks", env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}."),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for variant in ("padded", "buckets-cudnn", "buckets-cudnn-fixed-shape", "buckets", "varlen"):
        rates = re.findall(rf"^  {variant} +([0-9.]+) ms/step", result.stdout, re.MULTILINE)
        assert len(rates) == 2 and all(float(rate) > 0 for rate in rates), result.stdout
    for losses in re.findall(r"eval losses (\{.*\})", result.stdout):
        values = list(ast.literal_eval(losses).values())  # {'padded': 7.54, ...} as printed
        assert len(values) == 3 and max(values) - min(values) < 1e-4 * abs(values[0]), losses


@pytest.mark.slow  # ~2 minutes on the shared 2-core CPU: about 17 Python processes, three of them --check-resume's
def test_the_quick_suite_runs_to_a_full_report_without_datasets_and_wandb(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(ROOT)]))
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('datasets'), "
                            "u.find_spec('wandb')); import wandb"], env=env, capture_output=True, text=True)
    assert probe.stdout.split() == ["None", "None"] and "ModuleNotFoundError" in probe.stderr
    out = tmp_path / "out"
    result = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "--device", "cpu", "--quick", str(out)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(LOGS + ["report.md", "results.json"])  # <= 8 files
    report = (out / "report.md").read_text()
    assert re.search(r"CPU cores, /dev/shm [\d.]+ GiB free", report)  # where loader workers send their batches
    for heading in ["## Commands", "## Status"] + [f"## {n}. " for n in range(1, 9)]:
        assert heading in report, heading
    assert "failed to render" not in report and "no figure" not in report
    # LAMB's Triton kernel runs in Triton's interpreter here; without Triton (.ci/run installs it) it has no figure
    assert report.count("not measured") == (0 if HAS_TRITON else 2)  # its target row: measured, met
    results = json.loads((out / "results.json").read_text())
    assert [c["status"] for c in results["commands"]] == [gpu_suite.QUICK_INSTALL] + ["ok"] * 19
    figures = results["results"]
    assert len(figures["1"]) == 4 and all(r["ours"] > 0 and r["hf"] > 0 and r["peak"] > 0 < r["per_weight_casts"]
                                          for r in figures["1"])
    assert [r["label"] for r in figures["2"]] == [run["label"] for run in gpu_suite.pretrain_runs(True)
                                                  if "compile" not in run["label"]]
    for run in figures["2"] + figures["5"]:
        assert run["exit_code"] == (75 if run["time_limited"] else 0)  # 75: stopped (by its time limit), saved
        assert run["not_wrapped"] == [] and run["measured_steps"] > 0
        assert run["tokens_per_s"] > 0 and 0 < run["useful_mfu"] and 0 <= run["data_wait_share"] < 1
        assert run["peak_rss_gb"] > 0 and run["first_step_s"] > 0
    # the time-limited run stopped itself after its 12 minimum steps plus the one that read the stop; the other
    # runs did all their steps; the packed encoder computed no padding, the padded one all of it
    assert [(r["time_limited"], r["steps_run"], r["measured_steps"]) for r in figures["2"]] == \
        [(False, 15, 10), (False, 22, 10), (False, 15, 10), (True, 13, 8), (False, 15, 10)]
    # bert_large-128's bare step on its own last 4 batches: the batches of its steps 12-15, as their tokens show
    same = figures["2"][1]["bare_same_batches"]
    assert (same["steps"], same["first_micro_batch"]) == (4, 11) and same["real_tokens"] == same["run_tokens"] > 0
    same = figures["5"][0]["bare_same_batches"]  # and the compiled loop's: steps 7-10, the last it measured
    assert (same["steps"], same["first_micro_batch"]) == (4, 6) and same["real_tokens"] == same["run_tokens"] > 0
    assert [r.get("bare_same_batches") is not None for r in figures["2"]] == [False, True] + [False] * 3
    assert re.fullmatch(r"\d\.\d\d", table_rows(report, "## 2.")[1][11])
    padded, packed = figures["2"][2], figures["2"][3]
    assert padded["computed_padding_share"] == padded["padding_share"] > 0 == packed["computed_padding_share"]
    assert "last 8 of 13 (time limit)" in report
    # taking a batch: in-process, and from 2 workers tensor by tensor and in one buffer, each with a figure
    taking = [line for line in report.split("**Taking a batch**")[1].split("```")[1].splitlines()
              if line.startswith("    4  ")]  # the 4-row micro-batches' rows
    assert [line[7:35].strip() for line in taking] == list(loader_transfer.VARIANTS), taking
    assert all(float(line.split()[-4]) > 0 and line.endswith("x") for line in taking), taking
    assert [r["label"] for r in figures["5"]] == ["bert_large-128-compile", gpu_suite.COMPILE_WITH_WORKERS]
    assert [r["loader_workers"] for r in figures["2"] + figures["5"]] == [0] * 4 + [1, 0, 1]  # auto: none
    assert all(r["compiled_graphs"] >= 1 and 0 <= r["computed_padding_share"] < 1 for r in figures["5"])
    # the packed attention's length buckets run eager on a CPU (torch.compiler.disable): a graph break each
    assert all(r["graph_breaks"] >= 1 for r in figures["5"])
    assert figures["5-step"][0]["compiled"] and figures["5-step"][0]["ours"] > 0 < figures["5-step"][0]["compile_s"]
    assert [(r["first_step"], r["later_steps"]) for r in figures["3"]] == [(0, 0)] * 4
    assert figures["4"][0]["ratio"] > 0 and figures["4"][0]["lamb_host_ms"] > 0 < figures["4"][0]["fused_adamw_ms"]
    assert all(figures["4"][0][key] > 0 for key in ("clip_in_place_ms", "clip_scale_ms", "lamb_clip_in_place_ms",
                                                     "lamb_clip_scale_ms"))
    assert figures["4"][0]["kernel_vs_torch_ops"] < 1e-4  # LAMB's kernel (the C one here) agrees with its torch ops
    kernels = figures.get("4-kernels", [])  # the default and the pipelined schedule at the same block: bitwise
    assert [(r["schedule"], r["vs_default"], r.get("same_as_two_pass")) for r in kernels] == \
        [("two_pass", 0.0, None), ("pipelined", 0.0, True)] * HAS_TRITON
    assert all(r["device_ms"] > 0 and r["device_ratio"] > 0 and r["host_ahead"] for r in kernels)
    assert "**PASS**" in report
    assert "bert_large's loop with 1 loader workers (the training thread pins their batches) against 0" in report
    assert "The compiled loop with 1 loader workers (the training thread pins their batches) against 0" in report
    for heading, count in (("## 1.", 4), ("## 2.", 5), ("## 3.", 4), ("## 4.", 1 + 2 * HAS_TRITON),
                           ("## 5.", 3 + 1)):
        rows = table_rows(report, heading)
        assert len(rows) == count and all(re.search(r"\d", "".join(row[1:])) for row in rows), (heading, rows)
    assert {row[-1] for row in table_rows(report, "## 8.")} <= {"met", "**NOT met**", "not measured"}
    # 20 targets, the compiled loop's two among them (against the bare step on unpadded batches and on its own)
    assert len(table_rows(report, "## 8.")) == 20
    compiled_rows = [row for row in table_rows(report, "## 8.") if row[0].startswith("pretrain bert_large-128-compile")]
    assert len(compiled_rows) == 2 and all(re.fullmatch(r"\d\.\d\d", row[1]) for row in compiled_rows)
    profile = figures["7"][0]  # the groups split the ops' time, GEMMs among them
    assert abs(sum(profile["groups_ms"].values()) - profile["total_ms"]) < 1e-6 * profile["total_ms"]
    assert profile["groups_ms"]["GEMM"] > 0 and len(table_rows(report, "## 7.")) > 3
    loop = figures["2"][1]["profile"]  # bert_large-128's loop steps 20-21, after its measured (6-15) and marked steps
    assert loop["steps"] == [20, 21] and loop["tokens"] > 0 and figures["2"][1]["measured_end"] == 15
    assert loop["gaps"] is None and "**Where the loop's device waited**" not in report  # a CPU has no kernels
    assert abs(sum(loop["groups_ms"].values()) - loop["total_ms"]) < 1e-6 * loop["total_ms"]
    assert {"GEMM", "optimizer"} <= set(loop["groups_ms"]) and "aten::_fused_adamw_" in loop["ops_ms"]
    # bert_large-128's marked steps 18-19 (--marks 15:4: 16 partly, 17 after the sync left out), then the bare step's on
    # its batches: the points in the order the step passes them, the host's clock rising, no lead on a CPU
    loop_points = ["step start", "batch taken", "forward queued", "backward end", "norm end", "train_step end",
                   "optimizer start", "optimizer end", "step end"]
    for run, first in ((figures["2"][1], 18), (figures["5"][0], 13)):  # the compiled loop's --marks 10:4
        assert run["marks"]["first"] == first
        for marked, points in ((run["marks"], loop_points), (run["bare_same_batches"]["marks"],
                                                             ["step start", "forward end", "backward end",
                                                              "optimizer end", "step end"])):
            assert marked["steps"] == 2 and [row["point"] for row in marked["points"]] == points, marked
            hosts = [row["host_ms"] for row in marked["points"]]
            assert hosts == sorted(hosts) and hosts[-1] > 0 and all(row["lead_ms"] == 0 for row in marked["points"])
    eager_marks = report.split("**bert_large-128-compile: the host's time")[0]  # the compiled run's table follows
    segments = {row[0]: row[1:] for row in table_rows(eager_marks, "**bert_large-128: the host's time in each part")}
    assert list(segments) == loop_points[1:] + ["whole step"], segments
    assert float(segments["whole step"][0]) == pytest.approx(figures["2"][1]["marks"]["points"][-1]["host_ms"], 1e-3)
    assert all(float(segments[name][3]) > 0 for name in ("forward queued", "backward end", "optimizer end"))
    eager_part = report.split("**The compiled loop's step")[0]
    compared = {row[0]: row[1:] for row in table_rows(eager_part, "**The loop's step against the bare step.**")}
    assert "all ops" in compared and float(compared["GEMM"][0]) > 0 < float(compared["GEMM"][1])
    # the compiled loop's steps 15-16 (after its measured and marked ones) against the compiled bare step's profile
    compiled_loop, compiled_bare = figures["5"][0]["profile"], figures["7-compile"][0]
    assert compiled_loop["steps"] == [15, 16] and figures["5"][0]["measured_end"] == 10 and compiled_bare["compiled"]
    assert compiled_bare["groups_ms"]["GEMM"] > 0 < compiled_loop["groups_ms"]["GEMM"]
    compared = {row[0]: row[1:] for row in table_rows(
        report, "**The compiled loop's step against the compiled bare step.**")}
    assert float(compared["all ops"][0]) > 0 < float(compared["all ops"][1]) and float(compared["GEMM"][1]) > 0

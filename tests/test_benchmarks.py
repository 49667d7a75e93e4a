"""The benchmarks run to the end on a CPU (tiny shapes) and print a table of positive figures."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", line)]


def within_rounding(ratio: float, numerator: float, denominator: float, half_unit: float,
                    ratio_half_unit: float) -> bool:
    """Whether a printed ratio lies within the interval its two printed (rounded) operands allow."""
    lowest = (numerator - half_unit) / (denominator + half_unit)
    highest = (numerator + half_unit) / max(denominator - half_unit, 1e-12)
    return lowest - ratio_half_unit <= ratio <= highest + ratio_half_unit


def test_gpu_step_runs_on_cpu_with_a_tiny_shape():
    out = run("gpu_step.py", "--device", "cpu", "--shapes", "tiny", "--seqs", "32,64", "--batch", "2",
              "--rounds", "1", "--repeats", "1", "--gemm-size", "128")
    assert "ours seq/s" in out and "hf seq/s" in out and "fp32" in out
    rows = [line for line in out.splitlines() if line.startswith("tiny ")]
    assert [numbers(row)[:2] for row in rows] == [[32, 2], [64, 2]]
    for row in rows:  # seq/s ours and hf, speed-up, MFU ours and hf, peak
        assert all(value > 0 for value in numbers(row)[2:]), row


def test_gpu_step_times_bert_large_narrow_with_per_weight_casts_beside_it():
    """The host-time proxy (README, *GPU*): bert-large's 24 layers at width 16, bf16 autocast on the CPU."""
    out = run("gpu_step.py", "--device", "cpu", "--dtype", "bf16", "--shapes", "bert-large-narrow", "--seqs", "8",
              "--per-weight-casts", "--rounds", "1", "--repeats", "1", "--gemm-size", "64")
    row = next(line for line in out.splitlines() if line.startswith("bert-large-narrow "))
    assert numbers(row)[:2] == [8, 1] and "bf16" in out
    per_weight, ratio = (float(x) for x in re.findall(r"per-weight casts: ([\d.]+) seq/s, one cast per layer ([\d.]+)x",
                                                         row)[0])
    ours = numbers(row)[2]
    # The rates are printed to 0.1 seq/s, the ratio to 0.001
    assert per_weight > 0 and ours > 0 and within_rounding(ratio, ours, per_weight, 0.05, 0.0005), row


def test_split_heads_benchmark_prints_both_dtypes():
    out = run("split_heads.py", "--batch", "2", "--seq", "16", "--hidden", "64", "--heads", "4", "--rounds", "1",
              "--repeats", "1")
    rows = [line.split() for line in out.splitlines() if line.startswith(("float32 ", "bfloat16 "))]
    assert [row[0] for row in rows] == ["float32", "bfloat16"]
    for row in rows:  # ms with autograd's unbind, ms with split_heads, their ratio
        old, new, ratio = float(row[1]), float(row[2]), float(row[3].rstrip("x"))
        assert old > 0 and new > 0 and within_rounding(ratio, new, old, 0.0005, 0.005), row  # 3 decimals, and 2


def test_residual_bytes_benchmark_counts_fewer_bytes_with_the_bf16_residual():
    out = run("residual_bytes.py", "--config", "tiny_bert", "--batch", "2", "--seq", "16", "--rounds", "0")
    rows = {line.split()[0]: [float(x) for x in line.split()[1:5] + line.split()[6:7]] for line in out.splitlines()
            if line.startswith(("float32 ", "bf16 "))}
    (matmul32, attention32, other32, casts32, saved32), (matmul16, attention16, other16, casts16, saved16) = (
        rows["float32"], rows["bf16"])
    assert (matmul16, attention16) == (matmul32, attention32) and attention16 > 0  # the same GEMMs and attention
    assert other16 < other32 and casts16 < casts32  # the float32 stream's LayerNorms, adds and input casts
    assert 0 < saved16 < saved32  # e.g. the LayerNorms' inputs, kept in bf16
    ratio = float(out.split("float32 residual: ")[1].split("x")[0])
    assert abs(ratio - other16 / other32) <= 0.005 + 0.05 / other32, out


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accelerate_wrappers_benchmark_times_each_wrapper_beside_its_bare_call(precision):
    out = run("accelerate_wrappers.py", "--mixed-precision", precision, "--rounds", "1", "--calls", "5")
    rows = {line[:27].strip(): line[27:].split() for line in out.splitlines()[2:]}
    assert set(rows) == {"optimizer step + zero_grad", "forward", "backward"}, out
    for wrapped, bare, extra in rows.values():  # us through Accelerate, bare, and their difference (to 0.1 us)
        assert float(wrapped) > 0 and float(bare) > 0 and abs(float(wrapped) - float(bare) - float(extra)) <= 0.15, out


def test_lamb_host_benchmark_times_the_gpu_step_without_launching_a_kernel():
    """Each schedule's step with its kernels stubbed out: a launch the benchmark missed would fail on CPU tensors."""
    out = run("lamb_host.py", "--config", "tiny_bert", "--steps", "3")
    rows = {line.split()[0]: numbers(line) for line in out.splitlines() if line.startswith("  ")}
    assert "38 tensors in 2 groups" in out and set(rows) == {"two_pass", "pipelined", "the"}
    assert rows["two_pass"][0] > 0 and rows["pipelined"][0] > 0
    assert (rows["the"] and rows["the"][0] > 0) or "not timed (Triton is not installed)" in out, out


def test_adamw_host_benchmark_times_torchs_step_ours_and_the_kernels():
    out = run("adamw_host.py", "--config", "tiny_bert", "--rounds", "1", "--steps", "3")
    rows = {line.split("  ")[1].strip(): numbers(line.split("  ", 2)[2]) for line in out.splitlines()
            if line.startswith("  ")}
    assert "tiny_bert: 38 tensors in 2 groups" in out, out
    assert set(rows) == {"torch's AdamW(fused=True)", "FusedAdamW", "the kernels alone"}, rows
    assert rows["torch's AdamW(fused=True)"][-1] == 1.0 and all(ms > 0 for ms, ratio in rows.values())


def test_grad_norm_host_benchmark_times_the_norm_before_and_now_on_the_same_bits():
    """The benchmark asserts that all three norms agree bitwise before timing them (one group: the same kernels)."""
    out = run("grad_norm_host.py", "--config", "tiny_bert", "--rounds", "1", "--steps", "3")
    rows = {line[2:46].strip(): numbers(line[46:]) for line in out.splitlines() if line.startswith("  ")}
    assert "tiny_bert: 38 tensors, 1 group(s), cpu" in out, out
    assert set(rows) == {"get_total_norm, model.parameters() (before)", "global_norm, listed once (now)",
                         "the kernels alone"}, rows
    assert rows["get_total_norm, model.parameters() (before)"][-1] == 1.0 and all(ms > 0 for ms, _ in rows.values())


def test_shared_copies_benchmark_holds_fewer_bytes_for_the_backward():
    """tiny_albert applies its one layer twice: the shared copies keep one bf16 copy of it for the backward where a
    copy per application keeps two."""
    out = run("shared_copies.py", "--config", "tiny_albert", "--batch", "2", "--seq", "32", "--rounds", "1")
    rows = {line[2:18].strip(): numbers(line[18:]) for line in out.splitlines() if line.startswith("  ")
            and not line.startswith("  copies") and not line.startswith("  shared copies:")}
    assert set(rows) == {"shared", "per application"} and all(ms > 0 for ms, _ in rows.values()), out
    layer_mb = 2 * (4 * 128 * 128 + 2 * 128 * 512 + 9 * 128 + 512) / 2**20  # its 12 tensors in bf16
    assert abs(rows["per application"][1] - rows["shared"][1] - layer_mb) < 0.11, out  # printed to 0.1 MB


@pytest.mark.slow  # ~60 s on the shared 2-core CPU
def test_optimizer_step_prints_lamb_against_fused_adamw():
    out = run("optimizer_step.py", "--config", "tiny_bert", "--rounds", "2", "--per-parameter")
    table = {line.rsplit(None, 2)[0]: numbers(line.rsplit(None, 2)[1] + " " + line.rsplit(None, 2)[2])
             for line in out.splitlines() if line.endswith("x")}
    assert set(table) == {"fused AdamW", "LAMB", "LAMB, torch ops", "per-parameter LAMB"}
    assert table["fused AdamW"][1] == 1.0 and all(ms > 0 and ratio > 0 for ms, ratio in table.values())


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_the_bare_step_reads_nothing_back_as_training_does(monkeypatch, kind):
    """gpu_step / gpu_profile / model_step's step of ours gets the batch's layout built once, as the collator gives
    it with the batch in training: the step never builds one from the device tensors (three reads, syncs on a GPU)
    nor reads any other value back."""
    sys.path.insert(0, str(BENCHMARKS))
    import model_step
    import torch

    from bertrain.model import bert, build_model
    from tests.test_sync_free import no_host_reads

    config = model_step.model_config("albert-base" if kind == "albert" else "tiny", 0.0, 0.0)
    config.hidden_size, config.num_hidden_layers, config.intermediate_size = 64, 2, 128
    config.num_attention_heads = 2
    torch.manual_seed(0)
    model = build_model(config).train()
    before = [p.detach().clone() for p in model.parameters()]
    step = model_step.step_fn(model, model_step.make_batch(config, 2, torch.Generator().manual_seed(0), 16), False,
                              kind, None)

    def refuse(*args, **kwargs):
        raise AssertionError("the bare step built its layout from the batch's tensors")

    monkeypatch.setattr(bert, "layout_of", refuse)
    with no_host_reads():
        step()
        step()
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before) if p.requires_grad)


def test_model_step_finishes_without_native_bf16():
    out = run("model_step.py", "--shapes", "tiny", "--rounds", "1", "--repeats", "1")
    rows = [line for line in out.splitlines() if line.startswith("tiny ")]
    assert len(rows) == 1 and " fp32 " in rows[0] and all(value > 0 for value in numbers(rows[0])[1:])


def test_unigram_vs_sentencepiece_runs_on_any_text_file(tmp_path):
    pytest.importorskip("sentencepiece")
    from bertrain.data.sources.pydoc import pydoc_paragraphs

    text = tmp_path / "any.txt"
    text.write_text("\n".join(pydoc_paragraphs()[:1500]), encoding="utf-8")
    out = run("unigram_vs_sentencepiece.py", str(text), "--vocab-size", "800", "--top", "100", "--words", "from,if")
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines() if line.startswith(("tokens", "top"))}
    ours, theirs = (float(value) for value in rows["tokens per word"])
    assert 1.0 < ours < 3.0 and 1.0 < theirs < 3.0
    assert all(0 < float(value.rstrip("%")) <= 100 for value in rows["top 100 words as one token"])
    assert "from" in out and "bertrain: ▁" in out and "sentencepiece: ▁" in out


@pytest.mark.slow  # ~2 min on the shared 2-core CPU: pretrains, then fine-tunes with bertrain and Trainer
def test_evaluate_vs_trainer_prints_scores_and_speed():
    out = run("evaluate_vs_trainer.py", "--pretrain-steps", "20", "--seeds", "2", "--speed-examples", "64",
              "--rounds", "1")
    scores = [line.split()[0] for line in out.splitlines() if line.startswith(("bertrain ", "Trainer ")) and
              " median " in line]
    assert scores == ["bertrain", "Trainer"] and "the spread" in out
    speed = [line for line in out.splitlines() if line.endswith("examples/s") or "examples/s  (" in line]
    assert len(speed) == 2 and all(numbers(line)[0] > 0 for line in speed)
    assert numbers(next(line for line in out.splitlines() if line.startswith("speed-up")))[0] > 0


def test_gpu_pretrain_compiles_the_encoder_whole_with_the_layers_losses(tiny_data, tmp_path):
    """--compile-scope encoder (gpu_compile_probe.sh --encoder) compiles the encoder module, not its layers, and
    trains to the losses of the per-layer compiled run ("aot_eager": AOTAutograd's graphs, torch's kernels)."""
    import json
    import os

    losses = {}
    for scope in ("layers", "encoder"):
        run_dir = tmp_path / scope
        out = subprocess.run(
            [sys.executable, str(BENCHMARKS / "gpu_pretrain.py"), "--last", "4", "--compile-backend", "aot_eager",
             "--compile-scope", scope, "--", "--config", "tiny_bert", "--data", str(tiny_data), "--run-dir",
             str(run_dir), "--set", "train.max_steps=6", "--set", "train.log_every=2", "--set", "train.eval_every=0",
             "--set", "train.batch_size=4", "--set", "train.compile=true", "--set", "model.unpad=false"],
            capture_output=True, text=True, timeout=600, env=dict(os.environ, WANDB_MODE="disabled"))
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
        assert result["compiled_graphs"] >= 1 and result["graph_breaks"] == 0, result
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[scope] = [r["loss"] for r in records if r.get("kind") == "train"]
    assert len(losses["layers"]) == 3
    assert losses["encoder"] == pytest.approx(losses["layers"], rel=1e-5)  # float32 rounding over 6 steps


def test_compile_encoder_whole_compiles_the_encoder_module_instead_of_each_layer(monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_pretrain
    finally:
        sys.path.remove(str(BENCHMARKS))
    from bertrain.config import load_config
    from bertrain.model import build_model
    from bertrain.model.layers import EncoderLayer
    from bertrain.train import setup

    monkeypatch.setattr(setup, "compile_layers", setup.compile_layers)  # restored after the test
    gpu_pretrain.compile_encoder_whole()
    model = build_model(load_config("tiny_bert", ["model.vocab_size=100"]).model)
    assert setup.compile_layers(model, backend="eager") == 1
    compiled = [name for name, module in model.named_modules() if module._compiled_call_impl is not None]
    assert compiled == ["encoder"] and not any(isinstance(model.get_submodule(n), EncoderLayer) for n in compiled)


def test_gpu_bisect_runs_a_command_in_each_commits_snapshot_with_its_own_bertrain(tmp_path):
    """gpu_bisect.sh: prepare snapshots a commit (bertrain, benchmarks, configs); run runs the command in it, with the
    snapshot's bertrain imported, and names each commit and its exit in the summary."""
    if subprocess.run(["git", "-C", str(BENCHMARKS.parent), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("no git history here (gpu_bisect.sh prepares snapshots from it)")
    env = {**os.environ, "BISECT_DIR": str(tmp_path / "snapshots"), "PYTHON": sys.executable}
    script = str(BENCHMARKS / "gpu_bisect.sh")

    def bisect(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", script, *args], capture_output=True, text=True, env=env, timeout=300)

    assert bisect("prepare", "no-such-commit").returncode == 2
    assert bisect("prepare", "HEAD").returncode == 0
    head = subprocess.run(["git", "-C", str(BENCHMARKS.parent), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    snapshot = tmp_path / "snapshots" / head
    assert (snapshot / "bertrain" / "model" / "layers.py").is_file() and (snapshot / "configs").is_dir()
    out = tmp_path / "out"
    ran = bisect("run", str(out), sys.executable, "-c", "import bertrain, model_step; print(bertrain.__file__)")
    assert ran.returncode == 1, "model_step lives in benchmarks/, not on the path: the command fails, and says so"
    assert "(exit 1)" in (out / "summary.txt").read_text()
    # a script in a folder of its own, as benchmarks/*.py are: that folder on sys.path, not the snapshot
    which = tmp_path / "which.py"
    which.write_text("import bertrain\nprint('imported', bertrain.__file__)\n")
    ran = bisect("run", str(out), sys.executable, str(which))
    assert ran.returncode == 0, ran.stderr
    log = (out / f"{head}.log").read_text()
    assert f"imported {snapshot / 'bertrain' / '__init__.py'}" in log, log
    summary = (out / "summary.txt").read_text()
    assert summary.startswith(f"== {head} ") and "(exit 0)" in summary, summary
    # --profile: this tree's gpu_profile.py on the snapshot's bertrain, then the comparison (one commit: itself)
    ran = bisect("run", str(out), "--profile", "--device", "cpu", "--shape", "tiny", "--seq", "32", "--batch", "2",
                 "--compile-backend", "eager", "--steps", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"bertrain from {snapshot / 'bertrain' / '__init__.py'}" in (out / f"{head}.log").read_text()
    compare = (out / "compare.md").read_text()
    assert "tiny seq 32 batch 2 on cpu, compiled layers" in compare and f"| {head} " in compare, compare
    assert "| 1.000x |" in compare


def test_bisect_compare_names_the_ops_that_grew_appeared_or_vanished(tmp_path):
    """bisect_compare.py: each commit's total against the first's, and per op the difference, 'absent' where a
    commit ran no such op."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bisect_compare import compare, load
    finally:
        sys.path.remove(str(BENCHMARKS))

    def profile(ops: dict, gaps: dict | None = None) -> str:
        groups = {"attention": sum(v for k, v in ops.items() if "attention" in k), "GEMM": ops.get("aten::mm", 0)}
        return json.dumps(dict(shape="bert-large", seq=128, batch=128, device="cuda", compiled=True,
                               total_ms=sum(ops.values()), groups_ms=groups, ops_ms=ops, gaps=gaps)) + "\n"

    (tmp_path / "ORDER").write_text("aaaaaaa\nbbbbbbb\nccccccc\n")
    (tmp_path / "aaaaaaa.jsonl").write_text(profile({"aten::mm": 40.0, "aten::_cudnn_attention_backward": 5.0}))
    (tmp_path / "bbbbbbb.jsonl").write_text(profile({"aten::mm": 40.0, "aten::_efficient_attention_backward": 15.0},
                                                    dict(idle_ms=3.5, host_late_ms=1.25)))
    (tmp_path / "aaaaaaa.commit").write_text("the fast one\n")
    text = compare(load(tmp_path), top=5)  # ccccccc left no profile (its run failed): not a row
    assert "| aaaaaaa the fast one | 45.00 | 1.000x |  |" in text  # no trace figures (a CPU run)
    assert "| bbbbbbb | 55.00 | 1.222x | 3.50 (1.25) |" in text
    assert "ccccccc" not in text
    assert "| `aten::_efficient_attention_backward` | absent | 15.000 | +15.000 |" in text
    assert "| `aten::_cudnn_attention_backward` | 5.000 | absent | -5.000 |" in text
    assert text.index("_efficient_attention") < text.index("_cudnn_attention")  # the largest change first
    assert "`aten::mm`" in text.split("## bbbbbbb")[1]  # unchanged ops follow, up to --top


def test_trace_gaps_splits_the_device_idle_time_by_who_left_it(tmp_path):
    """trace_gaps.py on a made-up Chrome trace: overlapping kernels counted once as busy; a gap whose kernel was
    launched after the device ran dry is the host's, charged to the outermost host op around the launch (a Triton
    kernel's driver launch too); one whose kernel was queued before is not; gaps under the threshold apart."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from trace_gaps import device_gaps, load_events
    finally:
        sys.path.remove(str(BENCHMARKS))

    def op(name, ts, dur, cat="cpu_op"):
        return dict(ph="X", cat=cat, name=name, pid=1, tid=7, ts=ts, dur=dur)

    def kernel(ts, dur, correlation, stream=7, cat="kernel"):
        return dict(ph="X", cat=cat, name=f"k{correlation}", pid=0, tid=stream, ts=ts, dur=dur,
                    args=dict(correlation=correlation))

    def launch(ts, correlation, cat="cuda_runtime", name="cudaLaunchKernel"):
        return dict(ph="X", cat=cat, name=name, pid=1, tid=7, ts=ts, dur=3, args=dict(correlation=correlation))

    events = [
        op("autograd::engine::evaluate_function: AddmmBackward0", 0, 100), op("aten::mm", 1, 10),
        launch(2, 1), kernel(5, 10, 1),                      # busy 5-15
        launch(4, 2), kernel(12, 8, 2, stream=8),           # overlaps: busy to 20
        op("aten::addmm", 150, 20), op("aten::linear", 150, 50),  # the same start: the longer one holds the other
        launch(160, 3), kernel(165, 5, 3),                    # idle 20-165: the host's (145)
        launch(161, 4), kernel(190, 5, 4, cat="gpu_memcpy"),  # idle 170-190, queued at 161: not the host's (20)
        op("aten::gelu", 300, 20), launch(301, 5, "cuda_driver", "cuLaunchKernel"), kernel(305, 5, 5),  # 110, host
        launch(303, 6), kernel(311, 4, 6),                    # 1 us: under the threshold
        dict(ph="i", cat="instant", name="marker", ts=50),    # not a complete event
        launch(400, 7), kernel(410, 5, 7),                    # outside any op: host late, 95
    ]
    path = tmp_path / "trace.json"  # gzipped whatever its name, as gpu_pretrain.py --trace writes it
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events, "deviceProperties": []}, handle)
    (tmp_path / "plain.json").write_text(json.dumps(events))  # a bare list of events is a Chrome trace too
    assert load_events(tmp_path / "plain.json") == [e for e in events if e["ph"] == "X"]
    gaps = device_gaps(load_events(path), steps=2, min_gap_us=2.0)
    assert gaps["span_ms"] == pytest.approx((415 - 5) / 2e3)
    assert gaps["busy_ms"] == pytest.approx((15 + 5 + 5 + 5 + 4 + 5) / 2e3)
    assert gaps["host_late_ms"] == pytest.approx((145 + 110 + 95) / 2e3)
    assert gaps["queued_ms"] == pytest.approx(20 / 2e3) and gaps["short_ms"] == pytest.approx(1 / 2e3)
    assert gaps["idle_ms"] == pytest.approx(gaps["host_late_ms"] + gaps["queued_ms"] + gaps["short_ms"])
    assert [(row["op"], row["gaps"]) for row in gaps["late_ops"]] == [
        ("aten::linear", 0.5), ("aten::gelu", 0.5), ("(no op)", 0.5)]
    # each kernel's start less its launch's: 3, 8, 5, 29, 4, 8 and 10 us; the 10th percentile and the median
    assert (gaps["lead_p10_ms"], gaps["lead_p50_ms"]) == (pytest.approx(0.003), pytest.approx(0.008))
    assert device_gaps([op("aten::mm", 0, 5)]) is None  # a CPU trace: no device work


def test_the_backward_kernel_variants_compute_the_same_values(tmp_path):
    """benchmarks/gpu_backward_kernels.py (run by hand on a GPU): every variant of every case gives its case's values
    (fp32, within the rounding of a reduction over the tokens), and the report has a row for each."""
    from tests.helpers import rounding_rtol

    results = tmp_path / "rows.jsonl"
    tokens = 64
    out = run("gpu_backward_kernels.py", "--device", "cpu", "--tokens", str(tokens), "--hidden", "32", "--rounds", "1",
              "--repeats", "1", "--compile-backend", "aot_eager", "--results", str(results))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(row["case"].split(" [")[0], row["variant"]) for row in rows if "(now)" in row["variant"]] == [
        ("bias gradient, query/key/value", "sum over tokens (now)"),
        ("bias gradient, attention output and down", "sum over tokens (now)"),
        ("bias gradient, up", "sum over tokens (now)"),
        ("LayerNorm backward", "native_layer_norm_backward (now)"),
        ("GELU backward + up bias gradient", "gelu_backward, then sum (now)")]
    assert len(rows) == 18 and len(out.splitlines()) == 2 + 1 + 18  # the title, the table's head, a line a row
    for row in rows:
        assert row["us"] > 0 and row["wall_us"] > 0 and row["gb_per_s"] > 0 and row["host_ahead"], row
        assert row["largest_difference"] <= rounding_rtol(tokens, steps=2), row


def test_the_host_lead_probe_marks_each_layer_forward_then_backward(tmp_path):
    """benchmarks/gpu_host_lead.py (run by hand on a GPU): the points of a step in the order the step passes them,
    each layer's backward mark in reverse, host times rising; on a CPU, where an op is done when it returns, the host's
    lead over the device is 0 everywhere."""
    results = tmp_path / "lead.json"
    run("gpu_host_lead.py", "--device", "cpu", "--shape", "tiny", "--seq", "32", "--rounds", "2", "--repeats", "3",
        "--results", str(results))
    result = json.loads(results.read_text())
    layers = result["layers"]
    assert layers == 2 and result["steps_measured"] == 2 * (3 - 1)  # each run's first step left out
    assert [row["point"] for row in result["points"]] == [
        "step start", *[f"layer {i} forward" for i in range(1, layers + 1)], "forward end",
        *[f"layer {i} backward" for i in range(layers, 0, -1)], "backward end", "optimizer end"]
    hosts = [row["host_ms"] for row in result["points"]]
    assert hosts[0] == 0 and all(b > a for a, b in zip(hosts, hosts[1:])), hosts
    assert all(row["lead_ms"] == 0 and row["lowest_lead_ms"] == 0 for row in result["points"])
    assert result["marked_step_ms"] > 0 and result["plain_step_ms"] > 0

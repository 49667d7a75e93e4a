"""The runner behind gpu_suite.sh (use that): every GPU figure of issue 25, each part a subprocess with its
own timeout inside one overall budget, OUT_DIR/report.md rewritten after each command (a run cut short
still leaves a report), the raw output in five logs, the parsed figures in results.json.

    python benchmarks/gpu_suite.py [--device cpu --quick] OUT_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_report import render

ROOT = Path(__file__).resolve().parent.parent
QUICK_INSTALL = "not run: --quick installs nothing (the suite sets PYTHONPATH=.)"
PY = sys.executable
INFO = """import json, platform, torch, transformers, accelerate, tokenizers, importlib.util
cuda = torch.cuda.is_available()
triton = getattr(__import__("triton"), "__version__", None) if importlib.util.find_spec("triton") else None
print(json.dumps(dict(torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
    accelerate=accelerate.__version__, tokenizers=tokenizers.__version__, triton=triton,
    python=platform.python_version(),
    cuda_available=cuda, gpu=torch.cuda.get_device_name(0) if cuda else None,
    gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None)))"""
TIME_LIMIT = "{time_limit}"  # in a gpu_pretrain command: replaced by its timeout less its grace when it starts
WRITE_CORPUS = ("import sys; from bertrain.data.sources.pydoc import write_pydoc_corpus; "
                "print(write_pydoc_corpus(sys.argv[1], size_mb=float(sys.argv[2]), seed=0))")
TIME_BUDGET = "not measured (time budget)"
BUDGET_S = 520  # the runner's overall time; gpu_suite.sh kills it at 530 s (+10 s): 9 minutes at most


@dataclasses.dataclass
class Command:
    part: str           # "0" (setup) to "7"
    label: str
    argv: list[str]
    cap: float          # its own time limit, seconds
    floor: float        # time kept for it while earlier commands run
    expect: float       # seconds it should take on an H100 (the plan; the report shows it beside the time taken)
    log: str            # file in OUT_DIR its output is appended to
    min_start: float = 5.0        # with less time left it is not started
    grace: float = 0.0            # gpu_pretrain: its --time-limit is the timeout less this (stop, save, summary)
    optional: bool = False        # running out of time is no failure (torch.compile, run last)
    status: str = "not run"
    seconds: float = 0.0
    tail: str = ""      # its last lines of output, shown in the report when it failed
    note: str = ""      # said in the report beside its figures (e.g. the corpus it fell back to)

    def line(self) -> str:
        return " ".join(shlex.quote(str(a)) for a in self.argv)


def data_dirs(scratch: Path) -> dict[str, Path]:
    """pydoc: the small built-in corpus (its tokenizer serves the big one; sync and resume checks); corpus:
    synthetic documents of shuffled pydoc paragraphs (JSON lines); synthetic: those prepared (part 2)."""
    return {name: scratch / name for name in ("pydoc", "corpus", "synthetic")}


WITH_WORKERS = "bert_large-128-with-workers"  # part 2's loop A/B: loader workers, their batches pinned here
COMPILE_WITH_WORKERS = "bert_large-128-compile-with-workers"  # part 5's: the same for the compiled loop


def pretrain_runs(quick: bool) -> list[dict]:
    """Parts 2 and 5: label, config, seq, batch (part 1's for that shape), steps, log window, figures over the
    last steps, extra sets, part 1's row to compare with, and the run's time plan (see Command)."""
    if quick:  # tiny shapes, fp32, a few steps: the same commands on a CPU
        common = dict(config="tiny_bert", batch=4, steps=15, log_every=5, last=10, sets=["train.mixed_precision=no"],
                      seq=32, bare=("tiny", 32), cap=600, floor=0, expect=0, grace=15)
        at_64 = dict(common, seq=64, bare=("tiny", 64))
        return [dict(common, label="bert_base-128"),
                dict(common, label="bert_large-128", steps=22, profile="19:2",
                     bench_args=["--marks", "15:4", "--bare-steps", "4"]),
                dict(at_64, label="bert_base-512-unpad-false", sets=common["sets"] + ["model.unpad=false"]),
                # a run its time limit stops (after 12 steps): the path a slow GPU run takes
                dict(at_64, label="bert_base-512-unpad-true", sets=common["sets"] + ["model.unpad=true"], steps=1000,
                     time_limit=1, min_steps=12),
                dict(common, label="bert_large-128-compile", steps=17, last=5, optional=True, profile="14:2",
                     bench_args=["--marks", "10:4", "--bare-steps", "4"], sets=common["sets"] + ["train.compile=true"]),
                dict(common, label=WITH_WORKERS, optional=True, sets=common["sets"] + ["data.num_workers=1"]),
                dict(common, label=COMPILE_WITH_WORKERS, steps=10, last=5, optional=True,
                     sets=common["sets"] + ["train.compile=true", "data.num_workers=1"])]
    common = dict(steps=300, log_every=25, last=200, grace=15, sets=["model.vocab_size=30522",
                                                                     "train.mixed_precision=auto"])
    base = dict(common, config="bert_base", seq=128, batch=256, bare=("bert-base", 128))
    large = dict(common, config="bert_large", seq=128, batch=128, bare=("bert-large", 128))
    compiled = dict(large, log_every=10, sets=common["sets"] + ["train.compile=true"])
    at_512 = dict(common, config="bert_base", seq=512, batch=32, bare=("bert-base", 512), steps=200, log_every=10,
                  last=150, grace=12, sets=common["sets"] + ["data.max_predictions_per_seq=80"])
    # caps: the expected time with some margin; a slower run (run 1 on an H100 took 0.3-0.6 s a step where
    # the encoder ran packed) stops itself at its time limit, its figures over the steps it did
    return [dict(base, label="bert_base-128", cap=60, floor=40, expect=42),
            # marked (10 steps after the measured ones: the host's time and lead at each part of the step, no
            # profiler), then profiled (3 steps in a window of their own: a loop profiled before them stays slower)
            # against part 7's bare step: where its 10% go; then the bare step on its last 24 measured batches (~7 s
            # on the H200: what the loop itself costs, apart from its batches), marked once more after its timing
            dict(large, label="bert_large-128", steps=325, cap=95, floor=50, expect=68, grace=35, profile="310:3",
                 bench_args=["--marks", "300:10", "--bare-steps", "24"]),
            dict(at_512, label="bert_base-512-unpad-false", sets=at_512["sets"] + ["model.unpad=false"], cap=45,
                 floor=30, expect=28),
            dict(at_512, label="bert_base-512-unpad-true", sets=at_512["sets"] + ["model.unpad=true"], cap=45,
                 floor=25, expect=30),
            # the real loop compiled (train.compile: auto compiles runs of 5,000 steps or more on a GPU), after part
            # 5's compiled bare step, if 100 s or more are left; at bert_large, whose eager loop the host limits.
            # Marked, then profiled, after its measured steps 31-80 (profiled at 21-23 they ran 61.7 against 55.4 ms,
            # H200) against part 7's compiled bare step; then the compiled bare step on its last 24 measured batches
            # (~10 s), marked too
            dict(compiled, label="bert_large-128-compile", steps=95, last=50, cap=300, floor=0, expect=125, grace=25,
                 min_start=100, optional=True, profile="88:3", bench_args=["--marks", "80:8", "--bare-steps", "24"]),
            # bert_large-128's loop with 4 loader workers, whose batches the training thread pins itself since
            # 2026-11-28 (with DataLoader's pin thread beside the one launching the kernels two H200 runs took 80
            # against 68 ms a step; without it, 0.87 against 0.83 of the bare step): whether auto should start them
            dict(large, label=WITH_WORKERS, steps=150, last=100, cap=50, floor=0, expect=35, min_start=45,
                 optional=True, sets=large["sets"] + ["data.num_workers=4"]),
            # and the compiled loop with them, which long runs use (with the pin thread: 0.73 against 0.85, H200);
            # inductor's cache holds its graphs by now, so its first step takes seconds
            dict(compiled, label=COMPILE_WITH_WORKERS, steps=60, last=40, cap=60, floor=0, expect=40, min_start=45,
                 optional=True, sets=compiled["sets"] + ["data.num_workers=4"])]


def step_shapes(quick: bool) -> list[tuple[str, int]]:
    """Part 1's rows: (gpu_step.py shape, seq)."""
    shapes, seqs = (("tiny", "tiny-albert"), (32, 64)) if quick else (
        ("bert-base", "bert-large", "albert-base", "albert-large"), (128, 512))
    return [(shape, seq) for shape in shapes for seq in seqs]


# optional, when time is left, after part 5's runs, in this order: bert_large's loop with loader workers, compiled then
# eager (the compiled loop is the one below its target, and the eager loop's A/B ran once without the pin thread: 0.87
# against 0.83 of the bare step, H200; by the 2026-11-28 run's times about 60 s are left for these), the compiled bare
# step's profile, the time the training process takes for a batch from workers (loader_transfer.py), and LAMB's kernel
# configurations (two H200 runs agreed on the default; part 4's first command judges the LAMB target). The loop with
# per-weight casts left the suite after 2026-11-28: 0.81 against 0.83 of the bare step with one cast a layer (H200);
# part 1 still times the bare step both ways (gpu_step.py --per-weight-casts)
EXTRA_RUNS = (COMPILE_WITH_WORKERS, WITH_WORKERS, "profile-compile", "loader-transfer", "lamb-kernels")
# part 5's compiled bare step: the shape whose targets the eager step missed, then the issue's bert-base step
STEP_COMPILE_SHAPES = [("bert-large", 128), ("bert-base", 128)]


def target_shapes(quick: bool) -> dict:
    """Part 1's (shape, seq) rows that each speed target of the issue is judged on."""
    if quick:
        return {"bert-large": [("tiny", 32)], "bert-base": [("tiny", 32), ("tiny", 64)],
                "albert": [("tiny-albert", 32), ("tiny-albert", 64)]}
    return {"bert-large": [("bert-large", 128)], "bert-base": [("bert-base", 128), ("bert-base", 512)],
            "albert": [(shape, seq) for shape in ("albert-base", "albert-large") for seq in (128, 512)]}


def plan(device: str, quick: bool, scratch: Path) -> list[Command]:
    """Every command of the suite in the order run: by importance (1, 2, 3, 4, 6, 7), then the optional ones: the
    compiled step, the compiled loop, bert_large's loops (compiled and eager) with loader workers, the compiled
    step's profile, taking a batch from workers, LAMB's kernel configurations."""
    bench, results, data = ROOT / "benchmarks", scratch / "results", data_dirs(scratch)
    workers = 2 if quick else max(1, min(16, os.cpu_count() or 1))
    prepare = [PY, "-m", "bertrain", "prepare", "--recipe", "pydoc"]
    commands = [
        Command("0", "install", [PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                                 str(ROOT)], 60, 5, 5, "setup.log"),
        Command("0", "prepare-pydoc", prepare + ["--out", data["pydoc"]], 60, 5, 2, "setup.log"),
        # enough distinct documents for every part-2 run in one epoch (~15M tokens: 500+ steps of 256 x 128)
        Command("0", "corpus", [PY, "-c", WRITE_CORPUS, data["corpus"], "0.4" if quick else "64"], 60, 5, 4,
                "setup.log"),
        Command("0", "prepare-synthetic", prepare + ["--source", data["corpus"], "--tokenizer",
                                                     data["pydoc"] / "tokenizer", "--workers", str(workers),
                                                     "--num-shards", str(workers), "--out", data["synthetic"]],
                90, 15, 12, "setup.log")]
    step = [PY, bench / "gpu_step.py", "--per-weight-casts", "--results", results / "1.jsonl"]
    shapes = step_shapes(quick)
    step += ["--shapes", ",".join(dict.fromkeys(s for s, _ in shapes)), "--seqs", ",".join(
        str(q) for q in dict.fromkeys(q for _, q in shapes))]
    step += ["--device", device, "--batch", "4", "--rounds", "1", "--repeats", "1", "--gemm-size", "256"] if quick \
        else ["--rounds", "3"]
    # ours with per-weight casts beside it: 10 more steps a row (~5 s on the H200, where part 1 took 48 s on 2026-11-26)
    commands.append(Command("1", "gpu_step", step, 150, 60, 65, "step.log"))
    for run in pretrain_runs(quick):
        compiling = "compile" in run["label"]
        argv = [PY, bench / "gpu_pretrain.py", "--last", run["last"], "--label", run["label"], "--results",
                results / ("5.jsonl" if compiling else "2.jsonl"), "--time-limit", run.get("time_limit", TIME_LIMIT),
                "--min-steps", run.get("min_steps", 2 * run["log_every"])]
        if quick and compiling:
            argv += ["--compile-backend", "eager"]  # inductor's C++ build takes minutes on 2 cores
        if run.get("profile"):
            argv += ["--profile", run["profile"]]
        argv += run.get("bench_args", [])
        argv += ["--", "--config", run["config"], "--data", data["synthetic"], "--run-dir", scratch / run["label"]]
        sets = [f"train.max_steps={run['steps']}", f"train.log_every={run['log_every']}", "train.eval_every=0",
                "train.save_every=100000", f"train.batch_size={run['batch']}", f"data.max_seq_length={run['seq']}",
                "data.num_workers=auto", *run["sets"]]
        argv += [a for s in sets for a in ("--set", s)]
        commands.append(Command("5" if compiling else "2", run["label"], argv, run["cap"], run["floor"], run["expect"],
                                "compile.log" if compiling else "pretrain.log", min_start=run.get("min_start", 5.0),
                                grace=run["grace"], optional=run.get("optional", False)))
    checks = [PY, bench / "gpu_checks.py"]
    sync = checks + ["sync", "--data", data["pydoc"], "--results", results / "3.jsonl"]
    optimizer = checks + ["optimizer", "--results", results / "4.jsonl"]
    kernels = [PY, bench / "lamb_kernels.py", "--results", results / "4-kernels.jsonl"] + (
        ["--device", device, "--quick", "--config", "tiny_albert", "--vocab-size", "1000"] if quick
        else ["--config", "bert_base"])
    # ALBERT with LAMB (the Triton kernel on a GPU) and dropout: every random draw of the step is checked (the
    # H200 runs of 2026-11-26 passed with tiny_bert and fused AdamW, before the LAMB kernel's trial stopped drawing)
    resume = [PY, "-m", "bertrain", "pretrain", "--config", "tiny_albert", "--data", data["pydoc"], "--check-resume",
              "--set", "train.deterministic=true", "--set", "model.hidden_dropout_prob=0.1", "--set", "optim.name=lamb"]
    if quick:
        sync += ["--case", "tiny_bert:adamw", "--case", "tiny_albert:lamb", "--seq", "64", "--micro-batch", "4",
                 "--steps", "2", "--mixed-precision", "no"]
        optimizer += ["--config", "tiny_bert", "--device", device, "--rounds", "2", "--repeats", "1"]
        resume += ["--set", "train.batch_size=4", "--set", "data.max_seq_length=32", "--set",
                   "train.mixed_precision=no"]
    else:
        sync += ["--case", "bert_base:adamw", "--case", "albert_base:lamb", "--steps", "3"]
        optimizer += ["--config", "bert_base"]
    profile = [PY, bench / "gpu_profile.py", "--results", results / "7.jsonl"] + (
        ["--device", device, "--shape", "tiny", "--seq", "32", "--batch", "4", "--steps", "1"] if quick
        else ["--shape", "bert-large", "--seq", "128"])
    # the same with compiled layers, against part 5's profiled compiled loop (its layers from inductor's cache)
    profile_compiled = [a if a != results / "7.jsonl" else results / "7-compile.jsonl" for a in profile] + (
        ["--compile", "--compile-backend", "eager"] if quick else ["--compile"])
    # part 1's step with train.compile's compiled layers, beside part 1's eager step
    step_compiled = [PY, bench / "gpu_step.py", "--compile", "--results", results / "5-step.jsonl"] + (
        ["--device", device, "--shapes", "tiny", "--seqs", "32", "--batch", "4", "--rounds", "1", "--repeats", "1",
         "--gemm-size", "256", "--compile-backend", "eager"] if quick else
        ["--shapes", ",".join(s for s, _ in STEP_COMPILE_SHAPES), "--seqs", "128", "--rounds", "3"])
    # the training process's time to take a batch: made in-process, or from workers tensor by tensor, in a new buffer
    # a batch, or through their slots (4 variants since 2026-11-28: 30 s planned)
    transfer = [PY, bench / "loader_transfer.py", "--data", data["synthetic"], "--device", device, "--rounds", "1"] + (
        ["--rows", "4", "--seq", "32", "--workers", "2", "--steps", "5", "--step-ms", "5"] if quick
        else ["--rows", "128,256", "--workers", "4", "--steps", "40"])
    # expected: the H200's times (run of 2026-11-26 01:15) with a margin for an H100
    commands += [Command("2", "loader-transfer", transfer, 60, 0, 30, "pretrain.log", min_start=35, optional=True),
                 Command("3", "sync", sync, 60, 22, 22, "checks.log"),
                 Command("4", "optimizer", optimizer, 30, 15, 12, "checks.log"),
                 # apart: a kernel configuration that hangs costs this command only (its rows so far are kept)
                 Command("4", "lamb-kernels", kernels, 60, 0, 20, "checks.log", min_start=25, optional=True),
                 Command("6", "check-resume", resume, 120, 75, 40, "checks.log"),
                 Command("7", "profile", profile, 45, 20, 17, "step.log"),
                 Command("5", "gpu_step-compile", step_compiled, 170, 0, 120, "compile.log", min_start=90,
                         optional=True),
                 Command("7", "profile-compile", profile_compiled, 60, 0, 25, "step.log", min_start=25, optional=True)]
    extra = sorted((c for c in commands if c.label in EXTRA_RUNS), key=lambda c: EXTRA_RUNS.index(c.label))
    compile_runs = [c for c in commands if c.part == "5" and c not in extra]  # the pretrain run's, then the step's
    main = [c for c in commands if c.part != "5" and c not in extra]
    return main + compile_runs[-1:] + compile_runs[:-1] + extra


class Stopped(Exception):
    """SIGTERM from the outer timeout: end the running command and write the report."""


def run_command(command: Command, out: Path, timeout: float, env: dict) -> None:
    """Run one command (its process group killed at `timeout`), its output appended to its log."""
    if command.grace:
        limit = f"{max(timeout - command.grace, 1):.0f}"
        command.argv = [limit if str(a) == TIME_LIMIT else a for a in command.argv]
    log_path = out / command.log
    with open(log_path, "a") as log:
        log.write(f"\n===== part {command.part}, {command.label}: timeout {timeout:.0f} s\n$ {command.line()}\n")
        log.flush()
        start_offset = log.tell()
        started = time.monotonic()
        process = subprocess.Popen([str(a) for a in command.argv], cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
            command.status = "ok" if code == 0 else f"failed (exit {code})"
            with contextlib.suppress(OSError):  # what it left running (data or compile workers): not needed now
                os.killpg(process.pid, signal.SIGKILL)
        except (subprocess.TimeoutExpired, Stopped) as reason:
            stop_group(process)
            command.status = (f"timed out after {timeout:.0f} s" if isinstance(reason, subprocess.TimeoutExpired)
                              else "stopped by the suite's overall time limit")
            if isinstance(reason, Stopped):
                raise
        finally:
            command.seconds = time.monotonic() - started
            log.write(f"===== {command.label}: {command.status} in {command.seconds:.1f} s\n")
    with open(log_path, errors="replace") as log:
        log.seek(start_offset)
        command.tail = "\n".join(log.read().splitlines()[-15:])


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the command's process group (its data workers too), SIGKILL what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 3)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def machine_info(env: dict) -> dict:
    """Versions and the GPU, from a child process (this one never touches the GPU), and nvidia-smi's driver."""
    info: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count()}
    with contextlib.suppress(OSError):  # loader workers' batches travel here (under 1 GiB free: a warning)
        info["shm_free_gib"] = round(shutil.disk_usage("/dev/shm").free / 2**30, 1)
    try:
        info.update(json.loads(subprocess.run([PY, "-c", INFO], capture_output=True, text=True, timeout=60,
                                              env=env).stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, IndexError, json.JSONDecodeError) as error:
        info["error"] = f"version probe failed: {error}"
    for key, query in (("driver", "driver_version"), ("gpu_smi", "name")):
        try:
            info[key] = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30).stdout.strip() or "n/a"
        except (OSError, subprocess.SubprocessError):
            info[key] = "n/a (no nvidia-smi)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                                 timeout=10).stdout.count("\n")
        info["commit"] = f"{commit} ({changed} files changed)" if commit else "unknown (no git)"
    except (OSError, subprocess.SubprocessError):
        info["commit"] = "unknown (no git)"
    return info


def suite_failed(state: dict, commands: list[Command]) -> bool:
    """An abort or a command that did not succeed, except an optional one the time budget cut."""
    return bool(state.get("abort")) or any(c.status not in ("ok", QUICK_INSTALL) and not (
        c.optional and c.status.startswith((TIME_BUDGET, "timed out"))) for c in commands)


def synthetic_failed(commands: list[Command]) -> bool:
    """Whether writing or preparing the synthetic corpus ran and failed (part 2 then runs on pydoc's)."""
    return any(c.label in ("corpus", "prepare-synthetic") and c.status not in ("ok", "not run") for c in commands)


def read_results(scratch: Path) -> dict:
    """Part -> its JSON lines so far."""
    results = {}
    for path in sorted((scratch / "results").glob("*.jsonl")):
        results[path.stem] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="Tiny shapes in fp32 (the CPU test).")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"Overall time (default {BUDGET_S} s, quick 1500 s).")
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + (args.budget_s or (1500 if args.quick else BUDGET_S))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bertrain-gpu-suite-"))
    (scratch / "results").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               WANDB_MODE="disabled", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", COLUMNS="160", PYTHONUNBUFFERED="1")
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # a shared CPU: one thread each runs several times faster than oversubscribed
    commands = plan(args.device, args.quick, scratch)
    data = data_dirs(scratch)
    state = dict(device=args.device, quick=args.quick, out=str(out), scratch=str(scratch),
                 argv=" ".join(["bash benchmarks/gpu_suite.sh", *(["--device", args.device] if args.device != "cuda"
                                                                   else []), *(["--quick"] if args.quick else []),
                                str(args.out)]), runs=pretrain_runs(args.quick), roles=target_shapes(args.quick),
                 step_shapes=step_shapes(args.quick))

    def write_report(finished: bool) -> None:
        state["elapsed_s"], state["finished"] = time.monotonic() - started, finished
        results = read_results(scratch)
        text = render(state, commands, results)
        for name, content in (("report.md", text), ("results.json", json.dumps(dict(
                info=state.get("info"), commands=[dataclasses.asdict(c) | {"argv": c.line()} for c in commands],
                results=results), indent=1, default=str))):
            temporary = out / f".{name}.tmp"
            temporary.write_text(content)
            os.replace(temporary, out / name)

    def on_term(signum, frame):
        raise Stopped()

    signal.signal(signal.SIGTERM, on_term)
    write_report(False)
    try:
        state["info"] = machine_info(env)
        write_report(False)
        if args.device == "cuda" and not state["info"].get("cuda_available"):
            state["abort"] = "torch sees no CUDA device: nothing was measured (on a CPU: --device cpu --quick)."
        elif args.quick:  # a shared test machine: leave its packages alone (PYTHONPATH=. serves)
            commands[0].status = QUICK_INSTALL
        for index, command in enumerate(commands):
            if command.status != "not run" or state.get("abort"):
                continue
            later_floors = sum(c.floor for c in commands[index + 1:] if c.status == "not run")
            timeout = min(command.cap if not args.quick else 600, deadline - time.monotonic() - later_floors)
            if timeout < command.min_start:
                command.status = f"{TIME_BUDGET}: {max(timeout, 0):.0f} s left, {command.min_start:.0f} s needed"
                continue
            if str(data["synthetic"]) in map(str, command.argv) and synthetic_failed(commands):
                command.argv = [data["pydoc"] if str(a) == str(data["synthetic"]) else a for a in command.argv]
                command.note = "ran on the small pydoc corpus: preparing the synthetic one failed (setup.log)"
            run_command(command, out, timeout, env)
            if command.part in ("2", "5"):  # its figures are in; its checkpoint (4 GB at bert-large) is not needed
                shutil.rmtree(scratch / command.label, ignore_errors=True)
            print(f"part {command.part}, {command.label}: {command.status} in {command.seconds:.0f} s", flush=True)
            write_report(False)
    except Stopped:
        state["abort"] = "stopped by SIGTERM (the outer time limit of gpu_suite.sh)"
    finally:
        write_report(True)
        shutil.rmtree(scratch, ignore_errors=True)  # data, run dirs and checkpoints (GBs at BERT-large)
    sys.exit(1 if suite_failed(state, commands) else 0)


if __name__ == "__main__":
    main()

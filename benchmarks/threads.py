"""Training throughput with train.threads fixed (1, 2) and `auto`, on an idle machine and with one competing
busy process (`python3 -c "while True: pass"`), each variant a real `bertrain pretrain` in a subprocess.

    python benchmarks/threads.py                      # demo_albert's model on the pydoc recipe's data
    python benchmarks/threads.py --config tiny_bert --steps 40 --rounds 2

tokens/s of a run: tokens trained between its first and last logged step over the wall time between them
(auto's measurements included). Variants alternate within each round; the figure is the median over rounds.
Prints auto / best fixed per condition (target: >= 0.8 with the busy process; about 1 idle). The machine's
other load (load average) is printed with it: on a shared machine the figures are noisy. Not part of the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from unpad import prepared_pydoc  # benchmarks/unpad.py: the pydoc DATA_DIR cache

ROOT = Path(__file__).resolve().parents[1]


def run_tokens_per_s(config: str, data: Path, run_dir: Path, threads: str, steps: int, log_every: int
                     ) -> tuple[float, list[int]]:
    """One pretrain run's trained tokens per second of wall time (from its metrics.jsonl), and the counts
    `auto` chose (its "CPU threads: N" lines)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # auto keeps a count set there
    env.update(WANDB_MODE="disabled", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "bertrain", "pretrain", "--config", config, "--data", str(data),
               "--run-dir", str(run_dir), "--resume", "never", "--set", f"train.threads={threads}",
               "--set", f"train.max_steps={steps}", "--set", f"train.log_every={log_every}",
               "--set", "train.eval_every=0", "--set", f"train.save_every={steps}", "--set", "logging.report=false"]
    result = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    first, last = train[0], train[-1]  # from the first logged step: startup and first-call costs left out
    chosen = [int(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("CPU threads: ")]
    return (last["tokens_seen"] - first["tokens_seen"]) / (last["time"] - first["time"]), chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="Prepared DATA_DIR (default: prepare the pydoc recipe in a cache dir).")
    parser.add_argument("--config", default="demo_albert", help="Shipped config name or YAML (its model and batch).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="Steps per run.")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--conditions", default="idle,busy", help="idle, busy (one competing busy process) or both.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still ends the busy process (finally)

    data = Path(args.data) if args.data else prepared_pydoc(Path(tempfile.gettempdir()) / "bertrain-bench-pydoc")
    variants = ("1", "2", "auto")
    print(f"{args.config}, {args.steps} steps per run, {args.rounds} alternated rounds, {os.cpu_count()} cores")
    for condition in args.conditions.split(","):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "busy" else None
        try:
            rates: dict[str, list[float]] = {v: [] for v in variants}
            chosen: list[list[int]] = []
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as scratch:
                for r in range(args.rounds):
                    for threads in (variants if r % 2 == 0 else variants[::-1]):
                        run_dir = Path(scratch) / f"{threads}-{r}"
                        rate, counts = run_tokens_per_s(args.config, data, run_dir, threads, args.steps,
                                                        args.log_every)
                        rates[threads].append(rate)
                        chosen += [counts] if threads == "auto" else []
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        median = {v: statistics.median(rates[v]) for v in variants}
        best = max(("1", "2"), key=median.get)
        shown = ", ".join(f"threads={v} {median[v]:,.0f} ({' '.join(f'{x:,.0f}' for x in rates[v])})"
                          for v in variants)
        print(f"{condition if hog is None else 'one busy process'} (load average {load:.2f} at the start): "
              f"tokens/s {shown}; "
              f"auto chose (per run) {'; '.join(' then '.join(map(str, c)) for c in chosen)}; "
              f"auto / best fixed (threads={best}) = {median['auto'] / median[best]:.2f}")


if __name__ == "__main__":
    main()

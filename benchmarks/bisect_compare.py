"""The step's device time at each commit of a `gpu_bisect.sh run OUT --profile`, set against the first commit's:
per group and per op (gpu_profile.py's self device times), so that a regression names the ops that grew, or the ones
that appeared (another attention kernel, a copy); and the device's idle time (trace_gaps.py, on a GPU), the host's
share in brackets. Writes OUT/compare.md and prints it.

    python benchmarks/bisect_compare.py OUT_DIR [--top 15]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(out: Path) -> list[tuple[str, str, dict]]:
    """(hash, subject, gpu_profile's last result line) of each commit that has one, in the order they ran."""
    rows = []
    for commit in (out / "ORDER").read_text().split():
        results, about = out / f"{commit}.jsonl", out / f"{commit}.commit"
        lines = results.read_text().splitlines() if results.is_file() else []
        subject = about.read_text().strip() if about.is_file() else ""
        if lines:
            rows.append((commit, subject, json.loads(lines[-1])))
    return rows


def compare(rows: list[tuple[str, str, dict]], top: int) -> str:
    """The markdown: each commit's total and groups, then the ops that changed most against the first commit."""
    if not rows:
        return "No commit left a profile (see each commit's log).\n"
    groups = sorted({g for _, _, r in rows for g in r["groups_ms"]}, key=lambda g: -rows[0][2]["groups_ms"].get(g, 0))
    first = rows[0][2]
    shape = f"{first['shape']} seq {first['seq']} batch {first['batch']} on {first['device']}"
    lines = [f"# Bisect: the step's ops' self device time, ms a step ({shape}"
             f"{', compiled layers' if first.get('compiled') else ''})", "",
             "| commit | all ops | vs first | device idle (host late) | " + " | ".join(groups) + " |",
             "|---|---|---|---|" + "---|" * len(groups)]
    for commit, subject, result in rows:
        cells = [f"{result['groups_ms'].get(g, 0):.2f}" for g in groups]
        gaps = result.get("gaps") or {}
        idle = f"{gaps['idle_ms']:.2f} ({gaps['host_late_ms']:.2f})" if "idle_ms" in gaps else ""
        lines.append(f"| {f'{commit} {subject[:60]}'.strip()} | {result['total_ms']:.2f} | "
                     f"{result['total_ms'] / first['total_ms']:.3f}x | {idle} | " + " | ".join(cells) + " |")
    for commit, subject, result in rows[1:]:
        ops = set(first["ops_ms"]) | set(result["ops_ms"])
        changed = sorted(ops, key=lambda op: -abs(result["ops_ms"].get(op, 0) - first["ops_ms"].get(op, 0)))[:top]
        lines += ["", f"## {commit} against {rows[0][0]}: the ops that changed most", "",
                  f"| op | {rows[0][0]} ms | {commit} ms | difference |", "|---|---|---|---|"]
        for op in changed:
            before, after = first["ops_ms"].get(op), result["ops_ms"].get(op)
            lines.append(f"| `{op}` | {'absent' if before is None else f'{before:.3f}'} | "
                         f"{'absent' if after is None else f'{after:.3f}'} | {(after or 0) - (before or 0):+.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="gpu_bisect.sh run's OUT_DIR (its ORDER and <hash>.jsonl files).")
    parser.add_argument("--top", type=int, default=15, help="Ops listed per commit.")
    args = parser.parse_args()
    text = compare(load(args.out), args.top)
    (args.out / "compare.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()

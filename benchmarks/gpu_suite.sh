#!/usr/bin/env bash
# Every GPU figure of issue 25 in one command, from the repository root of a bare GPU machine (torch with CUDA,
# transformers, accelerate, tokenizers, typer, rich, pyyaml, safetensors; no datasets, wandb or network):
#
#   bash benchmarks/gpu_suite.sh OUT_DIR                    # the GPU run: under 9 minutes, install included
#   bash benchmarks/gpu_suite.sh --device cpu --quick OUT_DIR   # the same commands on tiny shapes (the test)
#
# Writes OUT_DIR/report.md (rewritten after each command, so a run cut short still leaves one), the raw
# output in OUT_DIR/{setup,step,pretrain,checks,compile}.log and the parsed figures in OUT_DIR/results.json.
# Each part runs with its own timeout inside one budget, most important first (torch.compile last, with what
# is left); a failed part is named in the report with its log.
# Set PYTHON to use another interpreter than python3.
set -u
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
device=cuda quick="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:?--device needs cuda or cpu}"; shift 2 ;;
    --quick) quick=--quick; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_suite.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu_suite.sh: one OUT_DIR only" >&2; exit 2; }; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.." || exit 2
limit=530  # seconds for everything (9 minutes at most with the 10 s kill delay): the runner budgets 520 s
[ -z "$quick" ] || limit=1800
timeout -k 10 "$limit" "${PYTHON:-python3}" benchmarks/gpu_suite.py --device "$device" $quick "$out"
code=$?
if [ ! -s "$out/report.md" ]; then
  printf '# bertrain GPU suite\n\nThe runner (benchmarks/gpu_suite.py) ended with exit %s before writing a report.\n' \
    "$code" > "$out/report.md"
fi
cat "$out/report.md"
echo "gpu_suite.sh: exit $code; report: $out/report.md"
exit "$code"

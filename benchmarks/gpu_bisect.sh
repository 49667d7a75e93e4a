#!/usr/bin/env bash
# One GPU figure across commits: the same command run on snapshots of several commits, one after another, on the GPU
# machine, which gets the working tree but not the git history. Here, first:
#
#   bash benchmarks/gpu_bisect.sh prepare REV...          # bisect/<short hash>/: bertrain, benchmarks, configs
#
# then on the GPU machine, with bisect/ carried along (it is git-ignored: the device tool's carry ["bisect"]):
#
#   bash benchmarks/gpu_bisect.sh run OUT_DIR [COMMAND...]
#   bash benchmarks/gpu_bisect.sh run OUT_DIR --profile [GPU_PROFILE_ARGS...]
#
# COMMAND runs in each snapshot, in the order prepared, with PYTHONPATH at the snapshot (its bertrain, not the
# installed one; each log's first line says which it imported). Default: the compiled bert-large bare step,
# `python3 benchmarks/gpu_step.py --compile --shapes bert-large --seqs 128 --rounds 3` (about 40 s a commit), whose
# seq/s on H200s went 1,659.7 (bb9b3ab), 2,119.7 (34b5922), 1,694.7 (9cb33a4). --profile: this tree's
# gpu_profile.py --compile (bert-large, seq 128; later arguments override) on each snapshot's bertrain, then
# bisect_compare.py: OUT_DIR/compare.md sets each commit's ops against the first's (about 35 s a commit). Writes
# OUT_DIR/<hash>.log and OUT_DIR/summary.txt (each commit's subject and its log's last lines). BISECT_DIR: another
# place than bisect/.
set -u
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
snapshots=${BISECT_DIR:-bisect}
case "${1:-}" in
  prepare)
    shift; [ $# -gt 0 ] || { usage >&2; exit 2; }
    mkdir -p "$snapshots" && snapshots="$(cd "$snapshots" && pwd)" || exit 2
    for rev in "$@"; do
      hash=$(git rev-parse --short=7 "$rev^{commit}") || { echo "gpu_bisect.sh: no commit $rev" >&2; exit 2; }
      rm -rf "${snapshots:?}/$hash" && mkdir -p "$snapshots/$hash"
      git archive "$hash" bertrain benchmarks configs | tar -x -C "$snapshots/$hash" --exclude='benchmarks/results' \
        || exit 1
      git log -1 --format='%h %cs %s' "$hash" | cut -c1-160 > "$snapshots/$hash/COMMIT"
      echo "$hash" >> "$snapshots/ORDER"
      echo "$snapshots/$hash: $(cat "$snapshots/$hash/COMMIT")"
    done ;;
  run)
    out="${2:?gpu_bisect.sh run needs OUT_DIR}"; shift 2
    [ -s "$snapshots/ORDER" ] || { echo "gpu_bisect.sh: nothing prepared in $snapshots: run prepare" >&2; exit 2; }
    snapshots="$(cd "$snapshots" && pwd)"
    tree=$(pwd) profile=0
    [ "${1:-}" = --profile ] && { profile=1; shift; }
    [ $# -gt 0 ] || [ $profile = 1 ] || set -- "$PY" benchmarks/gpu_step.py --compile --shapes bert-large --seqs 128 \
      --rounds 3
    mkdir -p "$out" && out="$(cd "$out" && pwd)" || exit 2
    : > "$out/summary.txt"; : > "$out/ORDER"
    code=0
    for hash in $(awk '!seen[$0]++' "$snapshots/ORDER"); do
      dir="$snapshots/$hash"
      echo "$hash" >> "$out/ORDER" && cut -d' ' -f3- "$dir/COMMIT" > "$out/$hash.commit"
      command=("$@")
      if [ $profile = 1 ]; then
        rm -f "$out/$hash.jsonl"
        command=("$PY" "$tree/benchmarks/gpu_profile.py" --compile --shape bert-large --seq 128 --results \
          "$out/$hash.jsonl" "$@")
      fi
      (cd "$dir" && export PYTHONPATH="$dir" WANDB_MODE=disabled &&
        "$PY" -c 'import bertrain; print("bertrain from", bertrain.__file__)' && timeout 600 "${command[@]}") \
        > "$out/$hash.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || code=1
      { echo "== $(cat "$dir/COMMIT") (exit $rc)"; tail -4 "$out/$hash.log"; } >> "$out/summary.txt"
      tail -5 "$out/summary.txt"
    done
    [ $profile = 0 ] || "$PY" "$tree/benchmarks/bisect_compare.py" "$out" || code=1
    exit $code ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac

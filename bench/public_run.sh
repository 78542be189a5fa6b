#!/usr/bin/env bash
# Runs klineage on the public development set (bench/public). It only runs klineage on the
# git-ignored kernels that are already there (kernel.cu, naive/kernel.cu, alt/*.cu, written by
# hand from the commits cited in bench/public/SOURCES.md); it never fetches, writes or
# assembles third-party code. A folder without its kernel.cu is skipped.
#
#   bench/public_run.sh build [DIR]   build-only verdicts (nvcc, no GPU) of every expert, naive
#                                     and alternate kernel, as DIR/<folder>.<role>.json
#                                     (default DIR: build/public_builds)
#   bench/public_run.sh gate OUT      full verdicts on the GPU (check on every workload, then
#                                     time against the reference) of every expert, naive and
#                                     alternate kernel, as OUT/<folder>.<role>.json; NO_TIME=1
#                                     checks only
#   bench/public_run.sh mine OUT [FOLDER...]
#                                     mine every expert (or the folders named, in that order) on
#                                     the GPU into OUT (skills, lineages, gate log) with
#                                     OUT/report_<folder>.json, one after another; a rerun into
#                                     the same OUT resumes from its gate log
#
# Then: python bench/public_lineages.py --builds DIR --mined OUT --references
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
klineage=(python3 -m klineage)
folders=()
for d in bench/public/*/; do
  d=${d%/}
  if [ -f "$d/steps.json" ] && [ -f "$d/kernel.cu" ]; then folders+=("$d"); fi
done
if [ ${#folders[@]} -eq 0 ]; then
  echo "no bench/public folder has its kernel.cu (see bench/public/README.md)" >&2
  exit 2
fi
# gate_every_kernel OUT [GATE FLAGS...]: one verdict per expert, naive and alternate kernel
gate_every_kernel() {
  local out=$1 d name alt stem
  shift
  mkdir -p "$out"
  for d in "${folders[@]}"; do
    name=$(basename "$d")
    "${klineage[@]}" gate "$d" "$@" --json "$out/$name.expert.json" > /dev/null
    echo "$name expert: exit $?"
    if [ -f "$d/naive/kernel.cu" ]; then
      "${klineage[@]}" gate "$d" --kernel "$d/naive/kernel.cu" "$@" \
        --json "$out/$name.naive.json" > /dev/null
      echo "$name naive: exit $?"
    fi
    for alt in "$d"/alt/*.cu; do
      [ -f "$alt" ] || continue
      stem=$(basename "$alt" .cu)
      "${klineage[@]}" gate "$d" --kernel "$alt" "$@" --json "$out/$name.alt-$stem.json" \
        > /dev/null
      echo "$name alt/$stem.cu: exit $?"
    done
  done
}

case "$mode" in
  build)
    gate_every_kernel "${2:-build/public_builds}" --build-only
    ;;
  gate)
    out=${2:?usage: bench/public_run.sh gate OUT}
    if [ -n "${NO_TIME:-}" ]; then gate_every_kernel "$out" --no-time; else gate_every_kernel "$out"; fi
    ;;
  mine)
    out=${2:?usage: bench/public_run.sh mine OUT}
    mkdir -p "$out"
    shift 2
    [ $# -gt 0 ] && folders=("${@%/}")
    for d in "${folders[@]}"; do
      name=$(basename "$d")
      "${klineage[@]}" mine "$d" --out "$out" --budget "${BUDGET:-300}" \
        --wall "${WALL_SECONDS:-3600}" --resume --report "$out/report_$name.json" \
        > "$out/mine_$name.log" 2>&1
      code=$?
      echo "$code" > "$out/exit_$name"  # bench/public_chunk.sh skips a walk that ended with 0
      echo "$name: exit $code"
    done
    ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Runs klineage on the public development set (bench/public). It only runs klineage on the
# git-ignored kernels that are already there (kernel.cu, naive/kernel.cu, alt/*.cu, written by
# hand from the commits cited in bench/public/SOURCES.md); it never fetches, writes or
# assembles third-party code. A folder without its kernel.cu is skipped.
#
#   bench/public_run.sh build [DIR]   build-only verdicts (nvcc, no GPU) of every expert, naive
#                                     and alternate kernel, as DIR/<folder>.<role>.json
#                                     (default DIR: build/public_builds)
#   bench/public_run.sh mine OUT      mine every expert on the GPU into OUT (skills, lineages,
#                                     gate log) with OUT/report_<folder>.json, one after another
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
case "$mode" in
  build)
    out=${2:-build/public_builds}
    mkdir -p "$out"
    for d in "${folders[@]}"; do
      name=$(basename "$d")
      "${klineage[@]}" gate "$d" --build-only --json "$out/$name.expert.json" > /dev/null
      echo "$name expert: exit $?"
      if [ -f "$d/naive/kernel.cu" ]; then
        "${klineage[@]}" gate "$d" --kernel "$d/naive/kernel.cu" --build-only \
          --json "$out/$name.naive.json" > /dev/null
        echo "$name naive: exit $?"
      fi
      for alt in "$d"/alt/*.cu; do
        [ -f "$alt" ] || continue
        stem=$(basename "$alt" .cu)
        "${klineage[@]}" gate "$d" --kernel "$alt" --build-only \
          --json "$out/$name.alt-$stem.json" > /dev/null
        echo "$name alt/$stem.cu: exit $?"
      done
    done
    ;;
  mine)
    out=${2:?usage: bench/public_run.sh mine OUT}
    mkdir -p "$out"
    for d in "${folders[@]}"; do
      name=$(basename "$d")
      "${klineage[@]}" mine "$d" --out "$out" --budget "${BUDGET:-300}" \
        --wall "${WALL_SECONDS:-3600}" --resume --report "$out/report_$name.json" \
        > "$out/mine_$name.log" 2>&1
      echo "$name: exit $?"
    done
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Mining on a two-GPU machine as two processes: the folders in $FIRST on GPU 0 and those in
# $SECOND on GPU 1, each pinned to half the CPU cores, both writing into skills_out/ (library
# updates are locked). Each half resumes from the gate log like mine_chunk.sh; the archives
# are written once, after both halves end, so they hold both halves' verdicts.
#
#   FIRST="expert_kernels/softmax expert_kernels/topk" SECOND=expert_kernels/fmha_fp16 \
#     bash bench/mine_pair.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
source bench/mine_state.sh
cores=$(nproc)
half=$((cores / 2))
half_run() {  # GPU, cores, report name, folders...
  local gpu=$1 cpus=$2 name=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$gpu taskset -c "$cpus" timeout "${CHUNK_SECONDS:-540}" \
    python3 -m klineage.cli mine "$@" --out skills_out --budget 300 \
    --wall "${WALL_SECONDS:-3600}" --resume --report "$OUT/mine_$name.json" \
    > "$OUT/mine_$name.log" 2>&1
  echo "$name exit $? (124: the chunk's time limit)"
}
# shellcheck disable=SC2086  # FIRST and SECOND are lists of folders
half_run 0 "0-$((half - 1))" first $FIRST &
first=$!
# shellcheck disable=SC2086
half_run 1 "$half-$((cores - 1))" second $SECOND
wait "$first"
tar czf "$OUT/gatelog.tgz" skills_out/gatelog
tar czf "$OUT/skills_out.tgz" --exclude=skills_out/gatelog skills_out

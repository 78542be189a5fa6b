#!/usr/bin/env bash
# Mining on a two-GPU machine as two processes: the folders in $FIRST on GPU 0 and those in
# $SECOND on GPU 1, each pinned to half the CPU cores, both writing into skills_out/ (library
# updates are locked). Each half resumes from the gate log like mine_chunk.sh; the archives
# are written once, after both halves end, so they hold both halves' verdicts.
#
#   FIRST="expert_kernels/softmax expert_kernels/topk" SECOND=expert_kernels/fmha_fp16 \
#     bash bench/mine_pair.sh
#
# With GPU_TESTS=1, GPU 1 first runs `pytest -m gpu` (log: $OUT/gpu_tests.log) and mines
# $SECOND in what is left of the chunk.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
source bench/mine_state.sh
cores=$(nproc)
half=$((cores / 2))
chunk=${CHUNK_SECONDS:-540}
half_run() {  # GPU, cores, report name, folders...
  local gpu=$1 cpus=$2 name=$3
  shift 3
  local left=$((chunk - SECONDS))
  if [ "$left" -lt 30 ]; then  # `timeout 0` would mean no limit at all
    echo "$name skipped: ${left} s of the chunk left"
    return
  fi
  CUDA_VISIBLE_DEVICES=$gpu taskset -c "$cpus" timeout "$left" \
    python3 -m klineage mine "$@" --out skills_out --budget 300 \
    --wall "${WALL_SECONDS:-3600}" --resume --report "$OUT/mine_$name.json" \
    > "$OUT/mine_$name.log" 2>&1
  echo "$name exit $? (124: the chunk's time limit)"
}
# shellcheck disable=SC2086  # FIRST and SECOND are lists of folders
half_run 0 "0-$((half - 1))" first $FIRST &
first=$!
if [ -n "${GPU_TESTS:-}" ]; then
  CUDA_VISIBLE_DEVICES=1 taskset -c "$half-$((cores - 1))" timeout "${TESTS_SECONDS:-420}" \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests exit $? after ${SECONDS} s" | tee -a "$OUT/gpu_tests.log"
fi
# shellcheck disable=SC2086
half_run 1 "$half-$((cores - 1))" second $SECOND
wait "$first"
tar czf "$OUT/gatelog.tgz" skills_out/gatelog
tar czf "$OUT/skills_out.tgz" --exclude=skills_out/gatelog skills_out

#!/usr/bin/env bash
# One device call on a two-GPU machine: replay on GPU 0 beside mining on GPU 1, each pinned to
# half of the CPU cores so nvcc builds of one never slow the other's timing loop. Both resume
# from the state archives in .state/ and write new ones to $OUT (see replay_chunk.sh and
# mine_chunk.sh). Without MINE, replay spreads over every GPU.
#
#   MINE="expert_kernels/fmha_fp16 expert_kernels/fused_add_rmsnorm" bash bench/device_call.sh
#
# Start the command that calls this with `... || exit 1; export PYTHONPATH=...; bash
# bench/device_call.sh`, never `... && (mining) & replay`: `&` backgrounds the whole `&&` list,
# and the replay then runs without the environment it needs.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results}
cores=$(nproc)
half=$((cores / 2))
if [ -n "${MINE:-}" ]; then
  # shellcheck disable=SC2086  # MINE is a list of folders
  CUDA_VISIBLE_DEVICES=1 taskset -c "$half-$((cores - 1))" bash bench/mine_chunk.sh $MINE \
    > "$OUT/mine.log" 2>&1 &
  miner=$!
  CUDA_VISIBLE_DEVICES=0 taskset -c "0-$((half - 1))" bash bench/replay_chunk.sh \
    > "$OUT/replay.log" 2>&1
  replay_status=$?
  wait "$miner"
  mine_status=$?
  echo "replay exit $replay_status, mine exit $mine_status (124: the chunk's time limit)"
else
  bash bench/replay_chunk.sh > "$OUT/replay.log" 2>&1
  echo "replay exit $?"
fi

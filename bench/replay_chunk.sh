#!/usr/bin/env bash
# One resumable chunk of the replay experiment, sized for one device call (10 minutes).
#
# Every gate verdict is appended to replay_out/gatelog/ as soon as it exists, so a chunk cut
# short by the time limit loses at most the verdict in flight; the next chunk replays the
# finished ones from the log (they still count against each method's budget) and goes on.
# Carry the state between calls as an archive:
#
#   run 1:   bash bench/replay_chunk.sh       (writes $OUT/replay_out.tar.xz.part-NN)
#   run N:   rm -f .state/replay_out.*; copy the last call's replay_out.tar.xz.part-* to
#            .state/, carry ".state", run the same command (bench/state_archive.sh)
#
# After a change of code, run `python bench/replay_finished.py settle skills,blind,memory,tree,profiled
# --profile` on any machine first (no GPU): it re-derives each problem from the log and marks
# finished those that need no new verdict, so the device only gates what is new.
#
# Problems go fastest first (naive latencies in bench/results/heldout_baseline.json), so the
# slow naive kernels (log_softmax, cross_entropy, cumsum: ~30 s per paired gate run) come last.
# bench/state/replay_gatelog.tar.xz also holds the lineages and replay_out/finished.json.
#
# The whole report (every problem) needs no GPU once every problem is finished: the gate logs
# hold every verdict and, since 2026-12-04, every profile (replay_out/gatelog/profiles/):
#
#   cat .state/replay_out.tar.xz.part-* | tar xJf - && python -m klineage replay heldout/* --skills skills_out \
#     --budget 30 --out replay_out --baselines blind,memory,tree,profiled --profile --offline
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
# GPU_MATCH (e.g. H200): run only where the GPU's name holds it. The gate log keys verdicts by
# kernel, not by card, so a chunk on another card would mix its timings into the experiment;
# the call may land on any card of its kind. Nothing is unpacked or written when it does not.
if [ -n "${GPU_MATCH:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case "$gpu" in
    *"$GPU_MATCH"*) ;;
    *) echo "not a $GPU_MATCH GPU (${gpu:-none found}): no chunk run, the state left as it was"
       exit 3 ;;
  esac
fi
source bench/state_archive.sh
if state_unpack replay_out; then
  :
elif [ -f bench/state/replay_gatelog.tar.xz ] && [ ! -d replay_out/gatelog ]; then
  tar xJf bench/state/replay_gatelog.tar.xz  # the verdicts of the last committed experiment
fi
# Problems go fastest first; those a chunk already finished with this skill library, these
# methods and this code are skipped (bench/replay_finished.py), so a chunk on a fresh machine does not
# rebuild every logged candidate of the cheap problems before reaching new work. ALL=1 runs
# every problem (the last chunk, which writes replay_out/replay.json over all of them).
methods="skills,${BASELINES:-blind,memory}"
order=$(python3 bench/replay_finished.py order "$methods")
if [ -z "$order" ]; then
  echo "every held-out problem is finished with this library and code; ALL=1 writes the whole report"
  state_pack replay_out replay_out
  exit 0
fi
started=$(date +%s)
# the GPU as nvidia-smi names it, kept in the state for bench/collect_replay.py --smi
mkdir -p replay_out
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  > replay_out/nvidia_smi.csv 2>/dev/null || true
# DEVICES (e.g. 0,1) spreads the problems over several GPUs; default: every visible GPU.
# BASELINES (e.g. blind,memory,tree) picks the methods beside skills; default: the command's.
# PROFILE=1 profiles (Nsight Compute) the states replay goes on from, which `profiled` needs:
#   PROFILE=1 BASELINES=blind,memory,tree,profiled bash bench/replay_chunk.sh
# shellcheck disable=SC2086  # a list of folders
timeout "${CHUNK_SECONDS:-540}" python3 -m klineage replay $order --skills skills_out \
  --budget "${REPLAY_BUDGET:-30}" --out replay_out --resume ${DEVICES:+--devices "$DEVICES"} \
  ${BASELINES:+--baselines "$BASELINES"} ${PROFILE:+--profile}
status=$?
python3 bench/replay_finished.py mark "$methods" "$started"
state_pack replay_out replay_out
exit $status

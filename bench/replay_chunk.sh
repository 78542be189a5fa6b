#!/usr/bin/env bash
# One resumable chunk of the replay experiment, sized for one device call (10 minutes).
#
# Every gate verdict is appended to replay_out/gatelog/ as soon as it exists, so a chunk cut
# short by the time limit loses at most the verdict in flight; the next chunk replays the
# finished ones from the log (they still count against each method's budget) and goes on.
# Carry the state between calls as an archive:
#
#   run 1:   bash bench/replay_chunk.sh                    (writes $OUT/replay_out.tgz)
#   run N:   copy the last replay_out.tgz to .state/, carry ".state", run the same command
#
# Problems go fastest first (naive latencies in bench/results/heldout_baseline.json), so the
# slow naive kernels (log_softmax, cross_entropy, cumsum: ~30 s per paired gate run) come last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
if [ -f .state/replay_out.tgz ]; then
  tar xzf .state/replay_out.tgz
elif [ -f bench/state/replay_gatelog.tar.xz ] && [ ! -d replay_out/gatelog ]; then
  tar xJf bench/state/replay_gatelog.tar.xz  # the verdicts of the last committed experiment
fi
order=$(python3 - <<'PY'
import json
from pathlib import Path
data = json.load(open("bench/results/heldout_baseline.json"))["problems"]
cost = {p["folder"]: sum(w["latency_ms"] or 0 for w in p["workloads"]) for p in data.values()}
# Every held-out folder runs; one the baseline file does not know (renamed since) goes last.
folders = [str(d) for d in Path("heldout").iterdir() if (d / "definition.json").is_file()]
print(" ".join(sorted(folders, key=lambda f: (f not in cost, cost.get(f, 0.0), f))))
PY
)
# DEVICES (e.g. 0,1) spreads the problems over several GPUs; default: every visible GPU.
# BASELINES (e.g. blind,memory,tree) picks the methods beside skills; default: the command's.
# PROFILE=1 profiles (Nsight Compute) the states replay goes on from, which `profiled` needs:
#   PROFILE=1 BASELINES=blind,memory,tree,profiled bash bench/replay_chunk.sh
timeout "${CHUNK_SECONDS:-540}" python3 -m klineage replay $order --skills skills_out \
  --budget 30 --out replay_out --resume ${DEVICES:+--devices "$DEVICES"} \
  ${BASELINES:+--baselines "$BASELINES"} ${PROFILE:+--profile}
status=$?
tar czf "$OUT/replay_out.tgz" replay_out
exit $status

#!/usr/bin/env bash
# One resumable chunk of mining, sized for one device call: the gate log in skills_out/gatelog/
# (git-ignored) makes a rerun resume. Carry it between calls as
# .state/gatelog.tar.xz.part-* (bench/state_archive.sh).
#
#   bash bench/mine_chunk.sh expert_kernels/gemm_bf16 expert_kernels/fmha_fp16
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
source bench/mine_state.sh
timeout "${CHUNK_SECONDS:-540}" python3 -m klineage mine "$@" --out skills_out \
  --budget 300 --wall "${WALL_SECONDS:-480}" --resume --report "$OUT/mine_chunk.json"
status=$?
state_pack gatelog skills_out/gatelog
tar czf "$OUT/skills_out.tgz" --exclude=skills_out/gatelog skills_out
exit $status

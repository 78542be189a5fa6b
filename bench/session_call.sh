#!/usr/bin/env bash
# One device call of ten minutes that does the short, high-value GPU steps in order, each with
# its own time limit, and packs everything into $OUT/results.tar.xz.part-NN after every step
# (the tool returns at most eight files of 16 MiB, and a call cut short keeps what finished):
#
#   1. the GPU check of the public-form pairs (tests/mechanisms/test_public_forms_gpu.py;
#      PUBLIC_K, a pytest -k expression, picks some, e.g. PUBLIC_K=clamped_count), then any
#      other GPU tests GPU_TESTS names (pytest arguments, e.g. "tests/test_heldout_gpu.py -k
#      split");
#   2. 01_gate.ipynb executed with the GPU (NOTEBOOK=0 skips it);
#   3. `mine --profile --resume` of the experts whose walks are all in the gate log
#      (PROFILE_EXPERTS, default RMSNorm; the five newer experts' cards lack them too): the
#      profiles of each skill's two states (counter deltas on the cards), and the gate runs
#      of whatever the log lacks (a walk cut at its wall, a round trip a rule now writes
#      differently); the results hold skills_out.tgz and the grown gatelog.
#
# Needs the wheels of `../shared/tools/device-wheels tree-sitter tree-sitter-cuda pydantic
# libcst bm25s distributed nbclient nbformat ipykernel docstring-parser` in .whl (carried),
# and the mining log: nothing in .state/ unpacks bench/state/mine_gatelog.tar.xz; or carry the
# last call's gatelog.tar.xz.part-* in .state/ (bench/state_archive.sh). Step limits: PUBLIC_S, NOTEBOOK_S, PROFILE_S.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-/tmp/klineage-session}")  # absolute: pack() packs from $work
work=$(mktemp -d)
mkdir -p "$work/r" "$OUT"
source bench/state_archive.sh
pack() { (cd "$work" && state_pack results r); }
step() {  # name, seconds, command...
  local name=$1 seconds=$2
  shift 2
  local started=$SECONDS
  timeout "$seconds" "$@" > "$work/r/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$work/r/steps.txt"
  pack
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/r/smi.csv" 2>&1
git rev-parse HEAD > "$work/r/commit.txt" 2>/dev/null || true

step public_forms_gpu "${PUBLIC_S:-150}" python3 -m pytest -q -rA -m gpu -p no:cacheprovider \
  tests/mechanisms/test_public_forms_gpu.py ${PUBLIC_K:+-k "$PUBLIC_K"}
if [ -n "${GPU_TESTS:-}" ]; then  # more GPU tests, pytest arguments: "tests/test_heldout_gpu.py -k split"
  # shellcheck disable=SC2086  # a list of pytest arguments
  step gpu_tests "${GPU_TESTS_S:-150}" python3 -m pytest -q -rA -m gpu -p no:cacheprovider $GPU_TESTS
fi
if [ "${NOTEBOOK:-1}" != 0 ]; then
  step notebook_01 "${NOTEBOOK_S:-120}" python3 notebooks/execute.py notebooks/01_gate.ipynb
  cp notebooks/01_gate.ipynb "$work/r/" 2>/dev/null
fi
source bench/mine_state.sh
# shellcheck disable=SC2086  # a list of folders
step profile_skills "${PROFILE_S:-240}" python3 -m klineage mine \
  ${PROFILE_EXPERTS:-expert_kernels/fused_add_rmsnorm} --out skills_out --resume --profile \
  --report "$work/r/mine_profile.json"
tar czf "$work/r/skills_out.tgz" --exclude=skills_out/gatelog skills_out
# the gate log too: a resumed walk or a round trip a rule now writes differently is a new
# verdict, which the next call (and bench/state/mine_gatelog.tar.xz) must keep
OUT="$work/r" state_pack gatelog skills_out/gatelog
pack
cat "$work/r/steps.txt"

#!/usr/bin/env bash
# One device call that does the most valuable GPU work the card it lands on allows (a call
# that names no kind may get an H100 or an H200):
#
#   - on an H200: one resumable chunk of the replay experiment (bench/replay_chunk.sh, with
#     the profiled baseline), whose state comes back as $OUT/replay_out.tar.xz.part-NN;
#   - on any other card: the GPU tests of the mechanisms and of the held-out problems, then
#     the gate and a mine of one public lineage (PUBLIC, default llmc_trimat_forward; its
#     git-ignored kernel.cu and naive/ must be carried), whose figures are indicative only
#     (the lineage figures are the H200's).
#
# Carry `.whl` (../shared/tools/device-wheels tree-sitter tree-sitter-cuda pydantic libcst
# bm25s typer rich docstring-parser pytest pytest-xdist execnet), and for the second branch the
# public kernel:
#
#   run(command="bash bench/adaptive_call.sh",
#       carry=[".whl", "bench/public/llmc_trimat_forward/kernel.cu",
#              "bench/public/llmc_trimat_forward/naive"])
#
# The replay chunk must run with the code bench/state/replay_gatelog.tar.xz was settled
# with (bench/state/README.md): call from a clean tree at that commit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-/tmp/klineage-adaptive}")
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1
export PYTHONPATH="/tmp/site:$PWD"
limit=${LIMIT_SECONDS:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "GPU: ${gpu:-none}"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
case "$gpu" in
  *H200*)
    OUT=$OUT GPU_MATCH=H200 CHUNK_SECONDS=$((limit - SECONDS)) PROFILE=1 \
      BASELINES=blind,memory,tree,profiled bash bench/replay_chunk.sh > "$OUT/chunk.log" 2>&1
    echo "replay chunk exit $?"
    tail -n 5 "$OUT/chunk.log"
    ;;
  "")
    echo "no GPU: nothing run"
    exit 3
    ;;
  *)
    # the tests build one kernel each: spread over the machine's cores (the gate's own timing
    # tests are not among them)
    timeout 280 python3 -m pytest -q -rA -m gpu -n 12 -p no:cacheprovider -p no:benchmark \
      tests/mechanisms tests/test_heldout_gpu.py > "$OUT/gpu_tests.log" 2>&1
    tail -n 3 "$OUT/gpu_tests.log"
    public="bench/public/${PUBLIC:-llmc_trimat_forward}"
    timeout 90 python3 -m klineage gate "$public" --json "$OUT/gate_expert.json" \
      > "$OUT/gate.log" 2>&1
    timeout 90 python3 -m klineage gate "$public" --kernel "$public/naive/kernel.cu" \
      --json "$OUT/gate_naive.json" >> "$OUT/gate.log" 2>&1
    WALL_SECONDS=$((limit - SECONDS)) bash bench/public_run.sh mine /tmp/public_mine "$public" \
      > "$OUT/mine.log" 2>&1
    tar cJf "$OUT/mine.tar.xz" -C /tmp public_mine
    tail -n 3 "$OUT/mine.log"
    ;;
esac

#!/usr/bin/env bash
# Record Nsight Compute reports of a few kernels on the H200, for the profile stage's CPU tests
# (recorded reports, parsed without a GPU). Each kernel is called once by bench/ncu_one.py under
# ncu; the first launch whose name matches the regex is profiled with the full set.
#
#   OUT=some/folder bash bench/ncu_sample.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/ncu}
mkdir -p "$OUT"
ncu --version > "$OUT/ncu_version.txt" 2>&1
ls -d "$(dirname "$(readlink -f "$(command -v ncu)")")"/extras/python >> "$OUT/ncu_version.txt" 2>&1
# problem folder, kernel file, kernel-name regex
while read -r name problem kernel regex; do
  start=$(date +%s.%N)
  timeout 90 ncu --clock-control none --set full \
    --kernel-name "regex:^($regex)" --launch-count 1 -f -o "$OUT/$name" \
    python3 bench/ncu_one.py "$problem" --kernel "$kernel" > "$OUT/$name.log" 2>&1
  echo "$name ncu exit $? in $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
  ncu --import "$OUT/$name.ncu-rep" --csv --page raw > "$OUT/$name.raw.csv" 2>> "$OUT/$name.log"
  ncu --import "$OUT/$name.ncu-rep" --csv --page details > "$OUT/$name.details.csv" 2>> "$OUT/$name.log"
done <<'LIST'
softmax expert_kernels/softmax expert_kernels/softmax/kernel.cu softmax
gemm_bf16 expert_kernels/gemm_bf16 expert_kernels/gemm_bf16/kernel.cu gemm_tiled|gemm_skinny|gemm_generic
sgemm_naive heldout/sgemm heldout/sgemm/kernel.cu sgemm
gelu_naive heldout/gelu heldout/gelu/kernel.cu gelu
LIST
ls -la "$OUT"

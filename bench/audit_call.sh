#!/usr/bin/env bash
# One device call that measures the audited gate against the gate before it, in the same run:
# gate overhead (bench/gate_overhead.py, this tree's script run on both gates: it uses only the
# API they share; the median of several whole verdicts), honest experts' latencies
# (bench/experts.py; old then new, or new only with EXPERTS_BEFORE=<an earlier old run>), then
# every adversarial fixture (bench/gate_audit.py). The old gate comes from .old/before.tar, a
# `git archive` of the commit before the audits, carried with the call. Results go to $OUT.
#
#   mkdir -p .old && git archive ad07951 klineage bench/_environment.py bench/experts.py \
#       expert_kernels/softmax expert_kernels/fused_add_rmsnorm expert_kernels/topk \
#       -o .old/before.tar
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/klineage-audit-call}
mkdir -p "$OUT" /tmp/before/bench
tar -xf .old/before.tar -C /tmp/before
cp bench/gate_overhead.py /tmp/before/bench/
EXPERTS="expert_kernels/softmax expert_kernels/fused_add_rmsnorm expert_kernels/topk"
REPEATS=${REPEATS:-7}

# from the old tree's folder: `python -m` in the worker puts the working folder first on its path
(cd /tmp/before && python3 bench/gate_overhead.py --skip-load-inline --repeats "$REPEATS" \
  --out "$OUT/overhead_before.json")
python3 bench/gate_overhead.py --skip-load-inline --repeats "$REPEATS" \
  --out "$OUT/gate_overhead.json" --before "$OUT/overhead_before.json"
before=${EXPERTS_BEFORE:-$OUT/experts_before.json}
if [ -z "${EXPERTS_BEFORE:-}" ]; then
  # shellcheck disable=SC2086  # EXPERTS is a list of folders
  (cd /tmp/before && python3 bench/experts.py $EXPERTS --out "$before") \
    > "$OUT/experts_before.log" 2>&1
fi
# shellcheck disable=SC2086
python3 bench/experts.py $EXPERTS --out "$OUT/experts.json" > "$OUT/experts.log" 2>&1
python3 bench/gate_audit.py --out "$OUT/gate_audit.json" --experts-before "$before" \
  --experts-after "$OUT/experts.json"

#!/usr/bin/env bash
# One device call that measures the audited gate against the gate before it, in the same run:
# gate overhead (bench/gate_overhead.py) and honest experts' latencies (bench/experts.py), each
# old then new, then every adversarial fixture (bench/gate_audit.py). The old gate comes from
# .old/before.tar, a `git archive` of the commit before the audits (klineage/, those two bench
# scripts, the three experts), carried with the call. Results go to $OUT.
#
#   git archive ad07951 klineage bench/gate_overhead.py bench/_environment.py \
#       bench/experts.py expert_kernels/softmax expert_kernels/fused_add_rmsnorm \
#       expert_kernels/topk -o .old/before.tar
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/klineage-audit-call}
mkdir -p "$OUT" /tmp/before
tar -xf .old/before.tar -C /tmp/before
EXPERTS="expert_kernels/softmax expert_kernels/fused_add_rmsnorm expert_kernels/topk"

# gate_overhead.py without its load_inline figure (a 60 s torch extension build, unchanged here)
overhead() {
  python3 - "$@" <<'PY'
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.path.insert(0, str(Path(script).resolve().parent))
sys.argv = sys.argv[1:]
main = runpy.run_path(script, run_name="bench")["main"]
main.__globals__["_load_inline_seconds"] = lambda source: float("nan")
main()
PY
}

# from the old tree's folder: `python -m` in the worker puts the working folder first on its path
(cd /tmp/before && overhead bench/gate_overhead.py --out "$OUT/overhead_before.json")
overhead bench/gate_overhead.py --out "$OUT/gate_overhead.json" --before "$OUT/overhead_before.json"
if [ -z "${EXPERTS_FROM:-}" ]; then
  # shellcheck disable=SC2086  # EXPERTS is a list of folders
  (cd /tmp/before && python3 bench/experts.py $EXPERTS --out "$OUT/experts_before.json") \
    > "$OUT/experts_before.log" 2>&1
  # shellcheck disable=SC2086
  python3 bench/experts.py $EXPERTS --out "$OUT/experts.json" > "$OUT/experts.log" 2>&1
  before="$OUT/experts_before.json" after="$OUT/experts.json"
else
  # both experts runs were made in an earlier call and kept: EXPERTS_FROM=bench/results
  before="$EXPERTS_FROM/experts_before_audits.json" after="$EXPERTS_FROM/experts.json"
fi
python3 bench/gate_audit.py --out "$OUT/gate_audit.json" --experts-before "$before" \
  --experts-after "$after"

"""Mine the experts again without a GPU: every verdict from the committed gate log, directly
or shared by machine code (klineage.gate.log). Tells whether the new walk needs any gate run.

    python bench/remine_offline.py expert_kernels/topk --out remine_out
    python bench/remine_offline.py bench/public/llmc_softmax_forward --from MINE_DIR --out DIR

The output folder gets the log (bench/state/mine_gatelog.tar.xz) and the committed lineages
(so the old verdicts' sources are known), or, with ``--from``, a copy of a ``klineage mine
--out`` folder a device call brought back (a public mine: its log and lineages); a problem that
needs a verdict the log lacks stops there, and the report names it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

from klineage.gate.build import Builder
from klineage.gate.log import LogOnlyGate, VerdictMissing
from klineage.mining.mine import mine

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument(
        "--from", dest="source", type=Path, default=None, help="a klineage mine --out folder"
    )
    args = parser.parse_args()
    out: Path = args.out
    if args.source is not None and not (out / "gatelog").is_dir():
        shutil.copytree(args.source, out, dirs_exist_ok=True)
    elif not (out / "gatelog").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        archive = REPO / "bench" / "state" / "mine_gatelog.tar.xz"
        subprocess.run(["tar", "xJf", str(archive), "-C", str(out)], check=True)
        shutil.move(str(out / "skills_out" / "gatelog"), str(out / "gatelog"))
        shutil.copytree(REPO / "skills_out", out, dirs_exist_ok=True)
    gate = LogOnlyGate(Builder())
    rows = []
    for problem in args.problems:
        started = time.monotonic()
        try:
            # the committed log predates the timing audits: read it as the old results it is
            old_log = args.source is None
            report = mine(problem, out, gate=gate, resume=True, reuse_unaudited=old_log)
            row = report.model_dump()
        except VerdictMissing as err:
            row = {"folder": str(problem), "missing": str(err)}
            kernel, against = gate.missing[-1]
            stem = out / f"missing-{kernel.fingerprint[:8]}"
            stem.with_suffix(".cu").write_text(kernel.text)
            if against is not None:
                stem.with_suffix(".against.cu").write_text(against.text)
        row["seconds"] = time.monotonic() - started
        rows.append(row)
        print(json.dumps(row)[:600], flush=True)
    if args.report:
        args.report.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

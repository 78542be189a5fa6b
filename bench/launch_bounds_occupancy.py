"""Does `launch_bounds` pay only where registers limit occupancy? Read from the replay's lineages.

    python bench/launch_bounds_occupancy.py [--archive bench/state/replay_gatelog.tar.xz]
        [--out bench/results/launch_bounds_occupancy.json]

No GPU: every launch_bounds gate run the replay made on the H200 is in the lineages of the
archive, with its parent state's source and ptxas registers. Per distinct (parent, child) run
(one however many methods' lineages hold it):
whether registers limit the parent's occupancy (blocks a multiprocessor holds by registers,
65,536 of them allocated 256 a warp, below what its 2,048 threads and 32 blocks allow, at the
launch's block size) and whether the run was keep-worthy (correct, faster by more than 1% and
in every trial). A rule ranking launch_bounds last where registers do not limit occupancy
would have been right only if keep-worthy runs were rare there.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms._tiles_util import block_threads  # noqa: E402

REGISTERS, THREADS, BLOCKS = 65536, 2048, 32
"""A multiprocessor's registers, resident threads and resident blocks (H200)."""


def register_limited(registers: int, block: int) -> bool:
    """Whether registers hold fewer blocks of `block` threads than threads and blocks allow."""
    per_warp = (registers * 32 + 255) // 256 * 256
    by_registers = REGISTERS // (per_warp * (block // 32)) if per_warp else BLOCKS
    return by_registers < min(THREADS // block, BLOCKS)


def keep_worthy(edge: dict[str, Any]) -> bool:
    trials = edge.get("trial_ratios") or [0.0]
    return bool(
        edge.get("status") == "accepted"
        and (edge.get("ratio") or 0.0) > 1.01
        and all(t > 1.0 for t in trials)
    )


def limited_state(node: dict[str, Any]) -> bool | None:
    """Whether registers limit some kernel of a state (None when a block size is unknown)."""
    source = KernelSource(node["source"]).parsed
    resources = list((node.get("resources") or {}).values())
    found = False
    for kernel, used in zip(source.kernels, resources, strict=False):
        block = block_threads(source, kernel.name)
        if block is None or not block.isdigit() or used.get("registers") is None:
            return None
        found |= register_limited(int(used["registers"]), int(block))
    return found


def tally(lineages: Path) -> dict[str, Any]:
    counts: Counter[tuple[str, bool]] = Counter()
    keeps: list[dict[str, Any]] = []
    seen = set()  # a run in several methods' lineages is one experiment
    for path in sorted(lineages.glob("*.json")):
        graph = json.loads(path.read_text(encoding="utf-8"))
        nodes = {node["id"]: node for node in graph["nodes"]}
        for edge in graph["edges"]:
            key = (edge["source"], edge["target"])
            if edge["mechanism"] != "launch_bounds" or key in seen:
                continue
            seen.add(key)
            limited = limited_state(nodes[edge["source"]])
            worthy = keep_worthy(edge)
            label = "unknown" if limited is None else "limited" if limited else "not_limited"
            counts[(label, worthy)] += 1
            if worthy:
                keeps.append({"lineage": path.stem, "limited": limited, "ratio": edge["ratio"]})
    return {
        "runs": sum(counts.values()),
        "by_occupancy": {
            label: {
                "runs": counts[(label, True)] + counts[(label, False)],
                "keep_worthy": counts[(label, True)],
            }
            for label in ("limited", "not_limited", "unknown")
        },
        "keep_worthy": keeps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archive", type=Path, default=REPO / "bench/state/replay_gatelog.tar.xz")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench/results/launch_bounds_occupancy.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.archive) as archive:
            members = [m for m in archive.getmembers() if "/lineages/" in m.name]
            archive.extractall(tmp, members=members, filter="data")
        result = tally(Path(tmp) / "replay_out" / "lineages")
    result["command"] = "python bench/launch_bounds_occupancy.py"
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result["by_occupancy"]))


if __name__ == "__main__":
    main()

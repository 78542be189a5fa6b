"""A PNG drawing of a lineage DAG: the main path as a column down the left (each step labelled
with the mechanism removed and the speed ratio it cost), and at each state the other attempts
fanned out to its right, labelled with their mechanism: accepted edges solid green, rejected
edges dashed red. Needs matplotlib (`pip install klineage[viz]`).
"""

from __future__ import annotations

from pathlib import Path

from klineage.lineage import LineageGraph

ACCEPTED = "#2b8a3e"
REJECTED = "#c92a2a"


def _positions(lineage: LineageGraph) -> dict[str, tuple[float, float]]:
    """Main-path states at x = 0, one row per step; every other child of a state in the row
    below it, from x = 1 rightwards."""
    graph = lineage.graph
    main = [lineage.root, *(a.child for a in lineage.main_path())]
    positions = {node: (0.0, -float(row)) for row, node in enumerate(main)}
    for row, node in enumerate(main):
        others = sorted(
            (d["mechanism"], child)
            for _, child, d in graph.out_edges(node, data=True)
            if child not in positions
        )
        for column, (_, child) in enumerate(others, start=1):
            positions[child] = (float(column), -float(row) - 0.5)
    # anything not reached from the main path (a resumed walk's strays) goes below it
    strays = [n for n in graph.nodes if n not in positions]
    for column, node in enumerate(strays):
        positions[node] = (float(column), -float(len(main)) - 1.0)
    return positions


def draw_lineage(lineage: LineageGraph, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("drawing needs matplotlib: pip install 'klineage[viz]'") from err
    import networkx as nx

    graph = lineage.graph
    positions = _positions(lineage)
    columns = max(x for x, _ in positions.values()) + 1
    rows = -min(y for _, y in positions.values()) + 1
    figure, axes = plt.subplots(figsize=(max(8.0, 1.1 * columns + 3), max(5.0, 0.7 * rows + 1)))
    edges = list(graph.edges(data=True))
    chosen = [(u, v) for u, v, d in edges if d.get("chosen")]
    side = [(u, v, d) for u, v, d in edges if not d.get("chosen")]
    colors = [
        ACCEPTED if data.get("status") == "PASSED" else REJECTED
        for _, data in graph.nodes(data=True)
    ]
    nx.draw_networkx_nodes(graph, positions, node_size=60, node_color=colors, ax=axes)
    for status, color, style in (("accepted", ACCEPTED, "solid"), ("rejected", REJECTED, "dashed")):
        subset = [(u, v) for u, v, d in side if d["status"] == status]
        nx.draw_networkx_edges(
            graph, positions, edgelist=subset, edge_color=color, style=style, alpha=0.5, ax=axes
        )
    nx.draw_networkx_edges(graph, positions, edgelist=chosen, width=3.0, ax=axes)
    for u, v, d in edges:
        x, y = positions[v]
        if d.get("chosen"):
            ratio = f" ({d['ratio']:.2f}x)" if d.get("ratio") else ""
            x0, y0 = positions[u]
            axes.text(
                x0 - 0.08, (y0 + y) / 2, d["mechanism"] + ratio, ha="right", va="center", fontsize=8
            )
        else:
            color = ACCEPTED if d["status"] == "accepted" else REJECTED
            axes.text(
                x,
                y - 0.12,
                d["mechanism"],
                ha="center",
                va="top",
                fontsize=5,
                rotation=25,
                color=color,
            )
    termination = lineage.termination.value if lineage.termination else "?"
    axes.set_title(
        f"{lineage.problem}: {termination}. Main path down the left (ratio: optimized / simpler "
        "latency); other attempts to the right, green accepted, red dashed rejected",
        fontsize=9,
    )
    axes.set_xlim(-3.5, columns + 0.5)
    axes.axis("off")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return target

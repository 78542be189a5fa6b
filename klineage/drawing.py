"""A PNG drawing of a lineage DAG: states in layers by depth, accepted edges solid green,
rejected edges dashed red, the main path thick. Needs matplotlib (`pip install klineage[viz]`).
"""

from __future__ import annotations

from pathlib import Path

from klineage.lineage import LineageGraph


def draw_lineage(lineage: LineageGraph, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("drawing needs matplotlib: pip install 'klineage[viz]'") from err
    import networkx as nx

    graph = lineage.graph
    for _, data in graph.nodes(data=True):
        data["layer"] = data.get("depth", 0)
    positions = nx.multipartite_layout(graph, subset_key="layer", align="horizontal")
    positions = {n: (x, -y) for n, (x, y) in positions.items()}
    width = max(8.0, 1.2 * max(1, graph.number_of_nodes() // 3))
    figure, axes = plt.subplots(figsize=(width, 8))
    accepted = [(u, v) for u, v, d in graph.edges(data=True) if d["status"] == "accepted"]
    chosen = [(u, v) for u, v, d in graph.edges(data=True) if d.get("chosen")]
    rejected = [(u, v) for u, v, d in graph.edges(data=True) if d["status"] == "rejected"]
    colors = [
        "#2b8a3e" if data.get("status") == "PASSED" else "#c92a2a"
        for _, data in graph.nodes(data=True)
    ]
    nx.draw_networkx_nodes(graph, positions, node_size=120, node_color=colors, ax=axes)
    nx.draw_networkx_edges(graph, positions, edgelist=accepted, edge_color="#2b8a3e", ax=axes)
    nx.draw_networkx_edges(
        graph, positions, edgelist=rejected, edge_color="#c92a2a", style="dashed", ax=axes
    )
    nx.draw_networkx_edges(graph, positions, edgelist=chosen, width=3.0, ax=axes)
    labels = {(u, v): d["mechanism"] for u, v, d in graph.edges(data=True) if d.get("chosen")}
    nx.draw_networkx_edge_labels(graph, positions, edge_labels=labels, font_size=7, ax=axes)
    termination = lineage.termination.value if lineage.termination else "?"
    axes.set_title(f"{lineage.problem}: {termination} (green accepted, red dashed rejected)")
    axes.axis("off")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return target

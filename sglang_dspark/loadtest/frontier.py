"""The throughput-interactivity frontier: aggregate output tok/s against median per-user tok/s.

One curve per arm (a run's report.json), one point per concurrency step labelled with its users,
and each SLA tier as a vertical line at its tok/s per user: points right of a tier's line meet it
at the median.
"""

from __future__ import annotations

from pathlib import Path


def frontier_points(report: dict) -> list[tuple[float, float, int]]:
    """(median per-user tok/s, aggregate output tok/s, users) of every step that has both."""
    return [(s["user_tok_s"]["p50"], s["aggregate_output_tok_s"], s["users"]) for s in report["steps"]
            if s["user_tok_s"]["p50"] is not None and s["aggregate_output_tok_s"] is not None]


def plot_frontier(arms: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    x_data = max((p[0] for _, report in arms for p in frontier_points(report)), default=1.0)
    for name, report in arms:
        points = frontier_points(report)
        line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        for x, y, users in points:
            ax.annotate(f"C={users}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8,
                        color=line.get_color())
    tiers = {(t["name"], t["tok_s_per_user"]) for _, report in arms for t in report["tiers"]}
    beyond = []
    for name, tok_s in sorted(tiers, key=lambda t: t[1]):
        if tok_s > 2 * x_data:  # drawn to scale it would squash every curve against the y axis
            beyond.append(f"{name} ({tok_s:g} tok/s)")
            continue
        ax.axvline(tok_s, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"{name} ({tok_s:g} tok/s)", (tok_s, 1), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=8, color="grey")
    if beyond:
        ax.annotate("off the chart, to the right: " + ", ".join(beyond), (0.99, 0.02), xycoords="axes fraction",
                    ha="right", fontsize=8, color="grey")
    ax.set_xlabel("median per-user speed (tok/s): (n_out - 1) / (t_last - t_first)")
    ax.set_ylabel("aggregate output tok/s")
    ax.set_title("Throughput vs interactivity, one point per concurrency C")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

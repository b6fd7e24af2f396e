"""The picture of a profile: measured SPS(B) per batch size with p10-p90 bars, and the fit."""

from __future__ import annotations

from pathlib import Path

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.profile.schema import Measurement


def plot_profile(measurements: list[Measurement], table: SpsTable, path: str | Path, title: str) -> None:
    """Dashed: the fitted table; its B = R point is the budget-0 step (drafter skipped when the
    table carries that saving)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for r in sorted({m.num_requests for m in measurements}):
        rows = [m for m in measurements if m.num_requests == r]
        x = [m.batch_tokens for m in rows]
        y = [1000.0 / m.median_ms for m in rows]
        err = [[yi - 1000.0 / m.p90_ms for yi, m in zip(y, rows)], [1000.0 / m.p10_ms - yi for yi, m in zip(y, rows)]]
        line = ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=f"R={r} measured")
        fx = list(range(r, max(x) + 1))
        ax.plot(fx, [table(b, num_requests=r, drafted=b > r) for b in fx], "--", color=line[0].get_color(), alpha=0.6)
    ax.set_xlabel("verify batch tokens B = R + budget")
    ax.set_ylabel("decode steps per second")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

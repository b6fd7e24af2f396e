"""The picture of a training run: held-out tau (T = 0 and T = 1) and first-draft acceptance against
the training compute spent, redrawn at every checkpoint so a long run can be watched as it goes."""

from __future__ import annotations

from pathlib import Path


def positions_seen(history: list[dict], step: int) -> int:
    """Supervised block positions the first `step` steps trained on."""
    return int(sum(h["positions"] for h in history[:step]))


def plot_curve(evals: list[dict], history: list[dict], path: str | Path, title: str) -> None:
    """x: minutes of training (top axis label: millions of positions at the last point)."""
    if not evals:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [e["elapsed_s"] / 60 for e in evals]
    fig, (tau_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    tau_ax.plot(minutes, [e["tau_t0"] for e in evals], "o-", label="tau, T = 0 (greedy match)")
    tau_ax.plot(minutes, [e["tau_t1"] for e in evals], "s-", label="tau, T = 1 (analytic)")
    tau_ax.set_ylabel("held-out tau (teacher-forced estimate)")
    acc_ax.plot(minutes, [e["greedy_match_per_position"][0] for e in evals], "o-", label="position 1, T = 0")
    acc_ax.plot(minutes, [e["accept_per_position"][0] for e in evals], "s-", label="position 1, T = 1")
    if len(evals[0]["accept_per_position"]) > 1:
        acc_ax.plot(minutes, [e["greedy_match_per_position"][1] for e in evals], "^--", label="position 2, T = 0")
    acc_ax.set_ylabel("held-out acceptance")
    for ax in (tau_ax, acc_ax):
        ax.set_xlabel(f"training minutes ({positions_seen(history, evals[-1]['step']) / 1e6:.1f} M positions "
                      f"at {minutes[-1]:.0f} min)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

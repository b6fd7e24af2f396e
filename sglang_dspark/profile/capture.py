"""In-process SPS(B) capture against the reference engine, and the fits SGLang's tables take.

For each batch size R, R long requests are prefilled, then decode steps run with a forced verify
budget b (the profiler knob SGLang calls dspark_force_budget_frac), so every probe measures a whole
decode step (draft + ragged verify + commit) at batch tokens B = R + b. Every probe starts from
freshly prefilled requests (constant context length), and probes run in a shuffled order so slow
drift (a noisy neighbour) does not masquerade as a B effect.

Two tables are fitted from the medians:
- SGLang's 1-D `SpsCostTable` (SPS as a floor step function of B), and
- SGLang's `SpsAdditiveCostTable`, step = bias + alpha(R) + theta(B), by least squares over the
  probes that drafted: the per-request term alpha carries the drafting cost, which a 1-D table
  cannot separate from B; and
- the drafter-skip saving per R (budget-0 probes, where the engine runs no drafter), which our
  engine's planner prices budget 0 with and SGLang's files leave out.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import numpy as np

from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable
from sglang_dspark.engine.sampling import SamplingParams


@dataclass(frozen=True)
class Probe:
    num_requests: int
    batch_tokens: int
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        return float(np.quantile(self.samples_ms, q))

    @property
    def p10_ms(self) -> float:
        return self.quantile_ms(0.1)

    @property
    def p90_ms(self) -> float:
        return self.quantile_ms(0.9)


def budget_grid(num_requests: int, gamma: int, points: int) -> list[int]:
    """Budgets 0..R*G: every value while few, else `points` spread evenly (ends included)."""
    top = num_requests * gamma
    if top + 1 <= points:
        return list(range(top + 1))
    return sorted({round(i * top / (points - 1)) for i in range(points)})


def _start_requests(engine, prompt_ids: list[int], count: int, max_tokens: int) -> None:
    for i in range(count):
        engine.submit(prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True, seed=i), lambda out: None)
    for _ in range(10_000):  # until every request has finished its prefill
        engine.step()
        if engine.num_running == count and all(not r.prefilling for r in engine._running):
            return
    raise RuntimeError("requests did not finish prefill")


def _reset(engine) -> None:
    for req in list(engine._running):
        engine.abort(req.id)
    engine.step()  # drains the aborts; nothing is left to run


def capture(
    engine,
    prompt_ids: list[int],
    *,
    requests: list[int],
    points: int = 9,
    warmup: int = 2,
    repeats: int = 7,
    rounds: int = 1,
    seed: int = 0,
    progress=None,
) -> list[Probe]:
    """Decode-step times for every (R, budget) probe. `engine` must be in scheduled mode.

    Each of `rounds` passes visits every probe once, in a fresh shuffled order, for `repeats`
    measured steps; a probe's samples pool over the passes. A shared host's speed drifts on the
    scale of seconds, so steps taken back to back share one bias: spreading a probe's samples
    over several passes lets the median average that bias out instead of inheriting it."""
    gamma = engine.gamma
    grid = [(r, b) for r in requests for b in budget_grid(r, gamma, points)]
    rng = random.Random(seed)
    probes = []
    for _ in range(rounds):
        order = list(grid)
        rng.shuffle(order)
        probes += order
    max_tokens = engine.max_len - len(prompt_ids)
    results = []
    for num_requests, budget in probes:
        # Fresh requests per probe: every probe sees the same short context (prompt plus what the
        # prefill and the probe emit), so attention cost does not drift between probes. The
        # output budget covers decode steps interleaved with a chunked prefill, then the probe.
        _reset(engine)
        _start_requests(engine, prompt_ids, num_requests, max_tokens=min(max_tokens, 4 * (warmup + repeats) * (gamma + 1)))
        engine.forced_budget_frac = min(1.0, (budget + 0.5) / (num_requests * gamma))
        for _ in range(warmup):
            engine.step()
        start = len(engine.records)
        for _ in range(repeats):
            engine.step()
        records = list(engine.records)[start:]
        tokens = statistics.median_low([r["num_verify_tokens"] for r in records])
        results.append(Probe(num_requests, tokens, tuple(r["step_ms"] for r in records if r["num_verify_tokens"] == tokens)))
        if progress is not None:
            progress.update(1)
    engine.forced_budget_frac = None
    _reset(engine)
    # Two budgets can land on the same B (top-K finds fewer candidates than the budget): pool them.
    pooled: dict[tuple[int, int], list[float]] = {}
    for p in results:
        pooled.setdefault((p.num_requests, p.batch_tokens), []).extend(p.samples_ms)
    return [Probe(r, b, tuple(samples)) for (r, b), samples in sorted(pooled.items())]


def fit_tables(points, max_batch_tokens: int):
    """(1-D cost table, additive table, draft-skip seconds) from measured points: `Probe`s or a
    profile's `Measurement`s (anything with num_requests, batch_tokens, median_ms)."""
    additive = fit_additive_table(points)
    skip = fit_draft_skip(points, additive)
    return fit_cost_table(points, max_batch_tokens), additive, None if skip is None else [round(v, 6) for v in skip]


def fit_cost_table(probes, max_batch_tokens: int) -> SpsCostTable:
    """SGLang's 1-D form: SPS at each measured B (median over the R that reached it)."""
    by_tokens: dict[int, list[float]] = {}
    for p in probes:
        by_tokens.setdefault(p.batch_tokens, []).append(p.median_ms)
    tokens = sorted(by_tokens)
    return SpsCostTable(
        sample_batch_tokens=tokens,
        sample_steps_per_sec=[1000.0 / statistics.median(by_tokens[b]) for b in tokens],
        max_batch_tokens=max(max_batch_tokens, tokens[-1]),
    )


def theta_knots(batch_tokens: list[int]) -> list[int]:
    """Where theta(B) gets a free value: every measured B up to 16 (small batches are where the
    curve bends), then measured B at least ~25 % apart, and the largest."""
    bs = sorted(set(batch_tokens))
    knots = [b for b in bs if b <= 16]
    for b in bs:
        if b > 16 and (not knots or b >= 1.25 * knots[-1]):
            knots.append(b)
    if knots[-1] != bs[-1]:
        knots.append(bs[-1])
    return knots


def fit_additive_table(probes) -> SpsAdditiveCostTable:
    """Step seconds = bias + alpha(R) + theta(B) over the probes that ran the drafter (B > R): the
    step SGLang's table describes always drafts.

    theta is piecewise linear between `theta_knots` (SGLang interpolates linearly between
    m_probes) and both alpha and theta are non-decreasing (more requests or tokens never make a
    step cheaper): non-negative least squares on their increments. Free per-B values would let
    B's seen by a single R absorb that R's term, and the fit swing with noise between them.
    """
    from scipy.optimize import nnls

    drafted = [p for p in probes if p.batch_tokens > p.num_requests]
    if not drafted:
        raise ValueError("no probe ran the drafter (every budget was 0): nothing to fit")
    rs = sorted({p.num_requests for p in drafted})
    knots = theta_knots([p.batch_tokens for p in drafted])
    # columns: alpha increments (R_1..), theta base, theta increments (knot_1..)
    design = np.zeros((len(drafted), len(rs) - 1 + len(knots)))
    for i, p in enumerate(drafted):
        design[i, : rs.index(p.num_requests)] = 1.0
        weights = _knot_weights(knots, p.batch_tokens)  # theta(B) = sum_j w_j theta(knot_j)
        cumulative = np.cumsum(weights[::-1])[::-1]  # theta(knot_j) = base + sum_{i<=j} increment_i
        design[i, len(rs) - 1 :] = cumulative
    target = np.array([p.median_ms / 1000.0 for p in drafted])
    coef, _ = nnls(design, target)
    alpha = np.concatenate([[0.0], np.cumsum(coef[: len(rs) - 1])])
    theta = np.cumsum(coef[len(rs) - 1 :])
    bias = max(float(theta[0]) * 0.5, 1e-5)  # SGLang requires bias > 0
    return SpsAdditiveCostTable(bias_seconds=bias, bs_probes=rs, alpha_seconds=alpha.tolist(),
                                m_probes=knots, theta_seconds=(theta - bias).tolist())


def _knot_weights(knots: list[int], b: int) -> np.ndarray:
    weights = np.zeros(len(knots))
    if b <= knots[0]:
        weights[0] = 1.0
    elif b >= knots[-1]:
        weights[-1] = 1.0
    else:
        hi = next(i for i, k in enumerate(knots) if k >= b)
        frac = (b - knots[hi - 1]) / (knots[hi] - knots[hi - 1])
        weights[hi - 1], weights[hi] = 1.0 - frac, frac
    return weights


def fit_draft_skip(probes, additive: SpsAdditiveCostTable) -> list[float] | None:
    """Per R of `additive`: the drafted step the table predicts at budget 0 (B = R) minus the
    budget-0 step measured, where the engine skipped the drafter. None without such probes."""
    measured = {p.num_requests: p.median_ms / 1000.0 for p in probes if p.batch_tokens == p.num_requests}
    if not measured:
        return None
    table = SpsTable(additive)
    skips = []
    for r in additive.bs_probes:
        nearest = min(measured, key=lambda m: (abs(m - r), m))  # every R is probed at budget 0 by capture()
        predicted = float(table.step_seconds(r, 1)[0])
        skips.append(min(max(predicted - measured[nearest], 0.0), 0.9 * predicted))
    return skips


def plot(probes, table: SpsTable, path) -> None:
    """Measured SPS(B) per batch size R (medians with p10-p90 bars) and the additive fit; the
    fit's B = R point is the budget-0 step without the drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for r in sorted({p.num_requests for p in probes}):
        ps = [p for p in probes if p.num_requests == r]
        x = [p.batch_tokens for p in ps]
        y = [1000.0 / p.median_ms for p in ps]
        err = [[yi - 1000.0 / p.p10_ms for yi, p in zip(y, ps)], [1000.0 / p.p90_ms - yi for yi, p in zip(y, ps)]]
        err = [[abs(e) for e in err[0]], [abs(e) for e in err[1]]]
        line = ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=f"R={r} measured")
        fx = list(range(r, max(x) + 1))
        ax.plot(fx, [table(b, num_requests=r, drafted=b > r) for b in fx], "--", color=line[0].get_color(), alpha=0.6)
    ax.set_xlabel("verify batch tokens B = R + budget")
    ax.set_ylabel("decode steps per second")
    ax.set_title("SPS(B) of the reference engine (dashed: additive fit)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

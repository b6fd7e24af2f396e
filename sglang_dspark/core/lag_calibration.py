"""Calibration of the confidences the asynchronous planner actually reads: rows that are L steps old.

STS calibrates a step's confidences for that step's drafts (lag 0). The planner must size a step
before it drafts, so it reads each request's row from `lag` drafted steps back, or a prior where a
request has none. Those promise what the drafts of *their* step did, not what this step's drafts
will do: for a weak drafter a high confidence two steps back is a winner's curse (measured in
benchmarks/planned_drafts.py: a chain's lagged rows promised far more surviving drafts than survived).

This module learns, per age group of the row, what a lagged conditional confidence x has been worth:
over every verified draft whose predecessors all survived, the outcome y (1 if it survived) against
the x the lagged row gave it, fitted as y = a + b x by least squares, pulled by `pseudo_drafts`
pseudo-observations toward a target: the identity (a = 0, b = 1) for a chain's rows and the prior,
the chain's own fit for older rows. So it starts as no correction and moves only with verified
outcomes. A multiplicative factor cannot express what the measurements show for a weak drafter:
lagged rows that promise 0.99 survive as often as those that promise 0.4 (b near 0), and the planner
drafts exactly where the row promises most.

The corrected confidence is the fit itself, above the row's own where rows under-promise: a row read
low keeps its request from drafting, so nothing replaces it until a probe, and a drafter whose
drafts survive whatever the row said is then never verified where it pays (a low row read as it is
stops a chain as surely as a high one read as it is starts one). Older rows, those of a request that
has not drafted since, start from the chain's fit rather than the identity for the same reason: a
stale low row read as it is would never draft again, so it would never teach its own group.
Pooled over draft positions: the relation does not depend on which positions a step verified, and
a per-position fit that noise pushed down would get its position verified less often and never
recover. The survival the planner reads is the running product of the corrected confidences.

It stays lossless: the correction changes only the capacity (how many drafts are verified), which
still depends only on past steps; which drafts are verified and how is unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

GROUPS = ("prior", "lag", "older")  # no row; a row `lag` steps old (a chain of drafted steps); older


def _as_list(values) -> list:
    """A tensor's or array's values as Python lists (one `tolist`); a list or tuple as it is."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


class LagCalibration:
    """Realized / promised conditional survival per age group of the lagged row, learned from
    verified drafts (counted per position too, for the report)."""

    def __init__(self, gamma: int, lag: int, *, pseudo_drafts: float = 4.0):
        if pseudo_drafts <= 0:
            raise ValueError(f"pseudo_drafts must be > 0, got {pseudo_drafts}")
        self.gamma, self.lag, self.pseudo_drafts = gamma, lag, pseudo_drafts
        # per group: n, sum x, sum y, sum x^2, sum x y over reached drafts
        self._sums = [[0.0] * 5 for _ in GROUPS]
        self._reached = [[0] * gamma for _ in GROUPS]  # per position, for the report
        self.version = 0  # bumped by every observation: the planner's memo key
        self._coef = torch.tensor([[0.0, 1.0]] * len(GROUPS), dtype=torch.float32)  # (a, b) per group
        self._coef_host = self._coef.numpy()  # the same memory, for the planner's numpy path

    def group(self, age: int | None) -> int:
        """The age group of a row `age` planner steps old (None: the request has no row)."""
        if age is None:
            return 0
        return 1 if age <= self.lag else 2

    @property
    def reached(self) -> np.ndarray:
        """[groups, G] int64: verified drafts reached per group and position, for the reports."""
        return np.array(self._reached, dtype=np.int64)

    def coefficients(self) -> torch.Tensor:
        """[groups, 2]: (a, b) of each group's fit (its target where nothing was observed)."""
        return self._coef

    def correct(self, conf: torch.Tensor, groups: list[int]) -> torch.Tensor:
        """The lagged conditional confidences [R, G] as they have held up: a + b x in [0, 1]."""
        coef = self._coef[torch.as_tensor(groups, dtype=torch.int64)]
        return (coef[:, :1] + coef[:, 1:] * conf).clamp_(0.0, 1.0)

    def correct_host(self, conf: np.ndarray, groups: list[int]) -> np.ndarray:
        """`correct` of float32 host rows in numpy, bit-equal (the same float32 multiply, add and clamp)."""
        coef = self._coef_host[groups]
        return np.clip(coef[:, :1] + coef[:, 1:] * conf, 0.0, 1.0)

    def observe(self, group: int, conf: np.ndarray, verify_len: int, accepted: int) -> None:
        """One request's verified step: `conf` [G] is the lagged row the capacity read (uncorrected
        conditional confidences), `verify_len` drafts were verified and the first `accepted` survived."""
        self.observe_many([group], np.asarray(conf)[None], [verify_len], [accepted])

    def observe_many(self, groups, conf, verify_lens, accepted) -> None:
        """`observe` for each row of a step at once, with one refit (a refit per request costs a
        scheduler thread too much at large batches): row i is group `groups[i]`, `conf` [R, G]; only
        positions whose predecessors all survived (up to min(verify length, accepted + 1)) count.
        Every drafted step comes here on the decode loop's thread, right after the target's forward
        has flushed the caches, where each numpy or torch call costs several microseconds: the sums
        are plain Python over the few reached drafts (R x G at most), one `tolist` per argument."""
        rows, lens, accs, groups = _as_list(conf), _as_list(verify_lens), _as_list(accepted), _as_list(groups)
        sums, reached, gamma, seen = self._sums, self._reached, self.gamma, False
        for group, row, verify, acc in zip(groups, rows, lens, accs):
            upto = min(int(verify), gamma, int(acc) + 1, len(row))
            if upto <= 0:
                continue
            seen = True
            n = sx = sy = sxx = sxy = 0.0
            for j in range(upto):
                x = float(row[j])
                y = 1.0 if j < acc else 0.0
                n, sx, sy, sxx, sxy = n + 1.0, sx + x, sy + y, sxx + x * x, sxy + x * y
                reached[group][j] += 1
            s = sums[group]
            s[0], s[1], s[2], s[3], s[4] = s[0] + n, s[1] + sx, s[2] + sy, s[3] + sxx, s[4] + sxy
        if not seen:
            return
        self._refit()
        self.version += 1

    def _refit(self) -> None:
        # the chain's group first: it is the older rows' target; each group's ridge fit is a 2 x 2
        # solve, written out (np.linalg.solve costs more than the rest of a step's bookkeeping)
        coef = [(0.0, 1.0)] * len(GROUPS)
        lam = self.pseudo_drafts  # ridge toward the target
        for group in (1, 0, 2):
            t0, t1 = coef[1] if group == 2 else (0.0, 1.0)
            n, sx, sy, sxx, sxy = self._sums[group]
            a00, a01, a11, r0, r1 = n + lam, sx, sxx + lam, sy + lam * t0, sxy + lam * t1
            det = a00 * a11 - a01 * a01
            a, b = (r0 * a11 - a01 * r1) / det, (a00 * r1 - a01 * r0) / det
            coef[group] = (float(np.float32(a)), float(np.float32(b)))  # the float32 the planner reads
        self._coef = torch.tensor(coef, dtype=torch.float32)
        self._coef_host = self._coef.numpy()

    def summary(self) -> dict:
        """Per group: reached drafts, their mean lagged confidence and survival, the fit (for the
        benchmarks' reports)."""
        out = {}
        for g, name in enumerate(GROUPS):
            n, sx, sy, _, _ = self._sums[g]
            a, b = self._coef[g].tolist()
            out[name] = {"reached": int(n), "mean_conf": round(sx / n, 3) if n else None,
                         "survived": round(sy / n, 3) if n else None, "a": round(a, 3), "b": round(b, 3)}
        return out

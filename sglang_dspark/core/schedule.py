"""Confidence-scheduled verification: how many drafts of each request to verify this step.

With l_r drafts verified for request r, a step carries B = sum_r (1 + l_r) batch tokens and emits
tau = sum_r (1 + sum_{j<=l_r} a[r, j]) tokens in expectation, a = cumprod(conf). Throughput is
Theta = tau * SPS(B) (docs/ALGORITHM.md, scheduling).

Candidates are ranked by (survival desc, position asc, request asc), the same value-independent
order SGLang uses. Ties therefore never rank a later draft of a request before an earlier one, so
"verify draft j" depends only on what was known before draft j was sampled: the losslessness rule.
"""

from __future__ import annotations

import functools
import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang_dspark.core.lag_calibration import LagCalibration
from sglang_dspark.core.sps import SpsTable

SURVIVAL_EPS = 1e-6  # SGLang's candidate floor (`DSparkScheduleConfig.survival_eps`)


@dataclass(frozen=True)
class BudgetDecision:
    budget: int  # draft tokens to verify this step, summed over requests
    predicted_step_seconds: float
    predicted_theta: float  # expected tokens per second


def _host_survival(conf: torch.Tensor | np.ndarray) -> np.ndarray:
    """cumprod of float32 conditional confidences [R, G] as torch's CPU cumprod computes it (SGLang's
    `compute_sort_survival`): a float64 running product rounded to float32 at each position, so
    survivals are bit-equal, in numpy (the planner runs between forwards, where a torch call costs more)."""
    if isinstance(conf, torch.Tensor):
        conf = conf.detach().to("cpu", torch.float32).numpy()
    return np.cumprod(np.asarray(conf, dtype=np.float32), axis=1, dtype=np.float64).astype(np.float32)


def _ranked_candidates(survival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted candidate survivals (float64) and their flat indices into survival.T.

    Flattening position-major (index j * R + r) lets one stable sort realise the tie order
    (position asc, request asc). The planner runs on the host on a few hundred values, where
    numpy's per-call cost is a fraction of torch's.
    """
    flat = survival.T.reshape(-1)
    order = np.argsort(-flat, kind="stable")
    values = flat[order]
    # Compare in the survival's own dtype (a weak Python scalar), as SGLang's torch code does.
    num_valid = int(np.count_nonzero(values >= SURVIVAL_EPS))
    return values[:num_valid].astype(np.float64), order[:num_valid]


def _theta_curve(sorted_survival: np.ndarray, num_requests: int, sps: SpsTable) -> tuple[np.ndarray, np.ndarray]:
    """theta(k) and step seconds for budgets k = 0..K, with K capped by the table's capacity."""
    max_budget = sorted_survival.size
    if sps.max_batch_tokens is not None:
        max_budget = max(0, min(max_budget, sps.max_batch_tokens - num_requests))
    tau = np.empty(max_budget + 1)
    tau[0] = 0.0
    np.cumsum(sorted_survival[:max_budget], out=tau[1:])
    tau += num_requests  # num_requests + prefix sum, in SGLang's order of float operations
    if sps.max_batch_tokens is None:  # additive form: SGLang divides by the step time
        seconds = sps.step_seconds(num_requests, max_budget + 1)
        return tau / seconds, seconds
    rate = sps.steps_per_sec(num_requests, max_budget + 1)
    return tau * rate, 1.0 / rate


def _pick_budget(theta: np.ndarray, early_stop: bool) -> int:
    if early_stop:
        # Algorithm 1: walk the ranked candidates, stop at the first one that does not raise Theta.
        rises = theta[1:] > theta[:-1]
        return int(rises.size if rises.all() else np.argmin(rises))
    return int(np.argmax(theta))  # global search; argmax keeps the first (smallest) on ties


def _lens_from_order(order: np.ndarray, budget: int, num_requests: int) -> torch.Tensor:
    counts = np.bincount(order[: max(0, int(budget))] % num_requests, minlength=num_requests)
    return torch.from_numpy(counts.astype(np.int64))


def _host(survival: torch.Tensor | np.ndarray) -> np.ndarray:
    return survival.detach().cpu().numpy() if isinstance(survival, torch.Tensor) else survival


def decide_budget(survival: torch.Tensor | np.ndarray, sps: SpsTable, *, early_stop: bool = False,
                  time_margin: float = 0.0) -> BudgetDecision:
    """Total verify budget for survival a [R, G] (cumulative, non-increasing along G; a tensor or a
    host array). `time_margin` m prices every drafted step (k > 0) at (1 + m) times the table's
    seconds when choosing: a draft must pay even if the table under-prices drafted steps by m (the
    plain step, k = 0, is what the table knows best). The decision reports the table's own price."""
    num_requests = survival.shape[0]
    values, _ = _ranked_candidates(_host(survival))
    theta, seconds = _theta_curve(values, num_requests, sps)
    if time_margin > 0.0:
        chosen = theta.copy()
        chosen[1:] /= 1.0 + time_margin
        k = _pick_budget(chosen, early_stop)
    else:
        k = _pick_budget(theta, early_stop)
    return BudgetDecision(k, float(seconds[k]), float(theta[k]))


def decide_budget_sla(survival: torch.Tensor, sps: SpsTable, tok_s_per_user: float, *,
                      overhead_seconds: float = 0.0, time_scale: float = 1.0) -> BudgetDecision:
    """SLA-aware budget: maximise Theta subject to every request's predicted speed
    (1 + sum of its verified survivals) / (step seconds + overhead) staying >= tok_s_per_user.

    `overhead_seconds` is the wall time each decode step also pays outside its own forward
    (interleaved prefills of new requests, streaming): users feel it, the SPS table does not hold it.
    `time_scale` multiplies the table's step seconds: the engine's measured/predicted ratio, for
    load the profile did not see.
    When no budget meets the SLA (the engine is too loaded for the tier), fall back to the budget
    that maximises the slowest request's predicted speed: the closest the step can get.
    """
    k, seconds, theta, slowest = _sla_curves(survival, sps, tok_s_per_user, overhead_seconds, time_scale)
    return BudgetDecision(k, float(seconds[k]), float(theta[k]))


def sla_speed(survival: torch.Tensor, sps: SpsTable, tok_s_per_user: float, *,
              overhead_seconds: float = 0.0, time_scale: float = 1.0) -> float:
    """Predicted speed of the slowest request at the budget `decide_budget_sla` picks."""
    k, _, _, slowest = _sla_curves(survival, sps, tok_s_per_user, overhead_seconds, time_scale)
    return float(slowest[k])


def _sla_curves(survival, sps, tok_s_per_user, overhead_seconds, time_scale=1.0):
    num_requests = survival.shape[0]
    values, order = _ranked_candidates(_host(survival))
    theta, seconds = _theta_curve(values, num_requests, sps)
    if time_scale != 1.0:
        theta, seconds = theta / time_scale, seconds * time_scale
    if overhead_seconds:
        theta = theta * seconds / (seconds + overhead_seconds)
    slowest = _slowest_tokens(values, order % num_requests, num_requests, theta.size - 1) / (seconds + overhead_seconds)
    feasible = slowest >= tok_s_per_user
    if feasible.any():
        k = int(np.argmax(np.where(feasible, theta, -np.inf)))
    else:
        k = int(np.argmax(slowest))
    return k, seconds, theta, slowest


DENSE_SLOWEST_MAX = 1 << 15  # budgets x requests up to which one dense cumsum beats a heap walk


def _slowest_tokens(values: np.ndarray, requests: np.ndarray, num_requests: int, k_max: int) -> np.ndarray:
    """[k_max + 1]: the smallest expected tokens (1 + its verified survivals) of any request when
    the top k ranked candidates (survival `values`, owner `requests`) are verified, k = 0..k_max."""
    if (k_max + 1) * num_requests <= DENSE_SLOWEST_MAX:
        per_request = np.zeros((k_max + 1, num_requests))
        per_request[np.arange(1, k_max + 1), requests[:k_max]] = values[:k_max]
        return (np.cumsum(per_request, axis=0) + 1.0).min(axis=1)
    # Large batches: each candidate raises one request's sum, so walk them with a lazy min-heap
    # (O(k log R) instead of a k x R matrix; the sums accumulate in the same order, so bit-equal).
    sums = np.zeros(num_requests)
    heap = [(0.0, r) for r in range(num_requests)]
    out = np.empty(k_max + 1)
    out[0] = 1.0
    for k in range(k_max):
        r = int(requests[k])
        sums[r] += values[k]
        while heap[0][0] != sums[heap[0][1]]:  # stale entry: re-key it with that request's sum now
            heapq.heapreplace(heap, (float(sums[heap[0][1]]), heap[0][1]))
        out[k + 1] = heap[0][0] + 1.0
    return out


def allocate_top_k(survival: torch.Tensor, budget: int) -> torch.Tensor:
    """Hand `budget` verify slots to the highest survivals; per-request counts are prefix lengths."""
    _, order = _ranked_candidates(_host(survival))
    return _lens_from_order(order, budget, survival.shape[0])


def plan_verify_lens(conf: torch.Tensor, sps: SpsTable, *, early_stop: bool = True) -> torch.Tensor:
    """Verify lengths int64 [R] in [0, G] for conditional survival conf [R, G].

    early_stop=True is Algorithm 1 exactly (lossless even when conf depends on this block's
    samples). early_stop=False is the global search over the whole curve; its total equals SGLang's
    `compute_verify_token_budget` and is only lossless on confidences that are lagged.
    """
    values, order = _ranked_candidates(_host_survival(conf))
    theta, _ = _theta_curve(values, conf.shape[0], sps)
    return _lens_from_order(order, _pick_budget(theta, early_stop), conf.shape[0])


class AsyncPlanner:
    """The production planner: capacity from lagged confidences, allocation from current ones.

    The engine must know a step's verify size before the step starts (CUDA-graph replay, overlap
    scheduling), so `capacity()` only reads confidences observed `lag` steps ago and searches the
    whole jagged SPS curve. `allocate()` then hands that capacity to this step's drafts by top-K of
    their current cumulative survival, which is prefix-closed. Capacity never depends on this
    step's samples, so the output distribution is the target's (docs/ALGORITHM.md, scheduling).

    Requests with fewer than `lag` observed steps have no history. With `prior="one"` they count
    as survival 1 at every position, like SGLang's planner (optimistic: new requests never shrink
    the capacity). With `prior="observed"` they count as the running mean of every confidence row
    observed so far (1 until there is one): where drafting does not pay, a new request then does
    not force full-depth verification for its first `lag` steps. Either prior comes from past
    steps only, so allocation stays lossless.
    `buckets` (sorted total verify-token sizes, e.g. CUDA-graph sizes) snap the step up to the
    next bucket and fill it with further drafts, since padded slots cost the same time.
    `sla_tok_s_per_user` switches the capacity search to `decide_budget_sla`, with the engine's
    measured per-step `overhead_seconds` and `time_scale`, and gates admission (`can_admit`).
    With `calibrate_lag` the lagged survival is corrected by how such rows have held up
    (`LagCalibration`, fed by `verified`), in capacity, admission and `expected_tokens` alike;
    without any verified step the correction is the identity.
    """

    def __init__(
        self,
        sps: SpsTable,
        gamma: int,
        *,
        lag: int = 2,
        buckets: Sequence[int] | None = None,
        sla_tok_s_per_user: float | None = None,
        prior: str = "one",
        calibrate_lag: bool = False,
    ):
        if lag < 1:
            raise ValueError(f"lag must be >= 1, got {lag}")
        if prior not in ("one", "observed"):
            raise ValueError(f"prior must be 'one' or 'observed', got {prior!r}")
        self.prior = prior
        self._prior_sum = torch.zeros(gamma, dtype=torch.float64)  # prior="observed": sum of every row
        self.rows_observed = 0  # confidence rows seen so far, over all requests
        self.sps, self.gamma, self.lag = sps, gamma, lag
        self.sla_tok_s_per_user = sla_tok_s_per_user
        self.buckets = sorted(int(b) for b in buckets) if buckets else None
        self._history: dict[Hashable, deque[torch.Tensor]] = {}
        self._observed_at: dict[Hashable, deque[int]] = {}  # the planner step of each history row
        self.clock = 0  # planner steps: capacity() calls
        self.calibration = LagCalibration(gamma, lag) if calibrate_lag else None
        self.last_decision: BudgetDecision | None = None
        self.overhead_seconds = 0.0  # SLA mode: the engine's measured non-forward time per decode step
        self.time_scale = 1.0  # SLA mode: how much slower steps run than the table predicts (engine-measured)
        # throughput mode: how much dearer drafted steps run than the table says (engine-measured;
        # 0 = the table's price)
        self.time_margin = 0.0
        # capacity() reads only the table, the histories and the request ids: while none changes (every
        # undrafted step of a steady batch: nothing is observed) its decision is the last one (on a CPU
        # the search is a few percent of a plain step).
        self._history_version = 0
        self._memo: tuple | None = None  # (table, key, decision)

    def _lagged_rows(self, request_ids: Sequence[Hashable]) -> list[torch.Tensor | None]:
        """Each request's confidence row from `lag` steps ago, None without that much history."""
        rows = []
        for rid in request_ids:
            hist = self._history.get(rid)
            rows.append(hist[0] if hist is not None and len(hist) == self.lag else None)
        return rows

    def _groups(self, request_ids: Sequence[Hashable]) -> list[int]:
        """Each request's lagged row's age group (LagCalibration.group), at the current step."""
        ages = []
        for rid in request_ids:
            at = self._observed_at.get(rid)
            ages.append(self.clock - at[0] if at is not None and len(at) == self.lag else None)
        return [self.calibration.group(a) for a in ages]

    def _survival(self, request_ids: Sequence[Hashable], groups: list[int] | None = None) -> np.ndarray:
        """The lagged survival [R, G] the decisions read: corrected where lag calibration is on
        (`groups`: the requests' age groups, when the caller has them)."""
        conf = self._lagged_conf(request_ids).numpy()
        if self.calibration is not None:
            conf = self.calibration.correct_host(conf, self._groups(request_ids) if groups is None else groups)
        return _host_survival(conf)

    def _lagged_conf(self, request_ids: Sequence[Hashable]) -> torch.Tensor:
        rows = self._lagged_rows(request_ids)
        if any(r is None for r in rows):
            default = self._prior_row()
            rows = [default if r is None else r for r in rows]
        return torch.stack(rows)

    def _prior_row(self) -> torch.Tensor:
        """What a request without history is read as: every draft survives, or the mean row observed."""
        if self.prior == "observed" and self.rows_observed:
            return (self._prior_sum / self.rows_observed).to(torch.float32)
        return torch.ones(self.gamma)

    def snap(self, num_requests: int, budget: int) -> int:
        """Round the step's total tokens up to the next bucket; fill with drafts up to R * G."""
        if not self.buckets:
            return budget
        total = num_requests + budget
        for bucket in self.buckets:
            if bucket >= total:
                return min(bucket - num_requests, num_requests * self.gamma)
        return budget  # larger than every bucket: the engine runs it eagerly

    def capacity(self, request_ids: Sequence[Hashable]) -> int:
        """Verify budget for this step, from history only (call before drafting)."""
        if not request_ids:
            return 0
        self.clock += 1
        key = (self._history_version, tuple(request_ids), self.sla_tok_s_per_user, self.overhead_seconds, self.time_scale,
               self.time_margin)
        groups = None
        if self.calibration is not None:
            groups = self._groups(request_ids)
            key += (self.calibration.version, tuple(groups))
        if self._memo is not None and self._memo[0] is self.sps and self._memo[1] == key:
            decision = self._memo[2]
        else:
            survival = self._survival(request_ids, groups)
            if self.sla_tok_s_per_user is None:
                decision = decide_budget(survival, self.sps, early_stop=False, time_margin=self.time_margin)
            else:
                decision = decide_budget_sla(survival, self.sps, self.sla_tok_s_per_user,
                                             overhead_seconds=self.overhead_seconds, time_scale=self.time_scale)
            self._memo = (self.sps, key, decision)
        self.last_decision = decision
        return self.snap(len(request_ids), decision.budget)

    def expected_tokens(self, request_ids: Sequence[Hashable], budget: int) -> float:
        """Tokens a step over `request_ids` emits in expectation when the `budget` most likely drafts
        are verified, from the lagged confidences (history only, as `capacity`)."""
        values, _ = _ranked_candidates(self._survival(request_ids))
        return len(request_ids) + float(values[: max(0, budget)].sum())

    def can_admit(self, request_ids: Sequence[Hashable], measured_slowest: float | None = None) -> bool:
        """SLA admission: may one more request join `request_ids` (the running batch)?

        Yes when nothing runs, or when the tier is out of reach even for a request alone (then
        limiting the batch would only cost throughput: the documented fallback serves everyone at
        the best slowest-user speed). Otherwise no while `measured_slowest`, the slowest running
        request's measured speed (tok/s since its first token), is below the tier: the loop closes
        over whatever the model misses (prefill stalls, probes, a host slowing down). Then yes
        when the predicted slowest speed with the newcomer still meets the tier. Requests without
        history, the newcomer included, count as the mean of those with history, or as survival 0
        (one token per step) when none has any: a tier is a promise, so admission is conservative
        where capacity is optimistic. Always yes outside SLA mode.
        """
        if self.sla_tok_s_per_user is None or not request_ids:
            return True
        lagged = self._lagged_rows(request_ids)
        known = [r for r in lagged if r is not None]
        typical = torch.stack(known).mean(dim=0) if known else torch.zeros(self.gamma)
        rows = [typical if r is None else r for r in lagged]
        speed = functools.partial(sla_speed, sps=self.sps, tok_s_per_user=self.sla_tok_s_per_user,
                                  overhead_seconds=self.overhead_seconds, time_scale=self.time_scale)
        groups = None  # a row that stands in for a request without history is the mean of lagged rows
        if self.calibration is not None:
            groups = [1 if r is None else g for r, g in zip(lagged, self._groups(request_ids))] + [1]

        def survival(conf: torch.Tensor, row_groups) -> torch.Tensor:
            conf = conf if row_groups is None else self.calibration.correct(conf, row_groups)
            return torch.from_numpy(_host_survival(conf))

        if speed(survival(typical[None], None if groups is None else [1])) < self.sla_tok_s_per_user:
            return True  # out of reach even alone: the fallback does not limit admission
        if measured_slowest is not None and measured_slowest < self.sla_tok_s_per_user:
            return False
        return speed(survival(torch.stack([*rows, typical]), groups)) >= self.sla_tok_s_per_user

    def allocate(self, conf: torch.Tensor, capacity: int) -> torch.Tensor:
        """Per-request verify lengths [R] for this step's conditional survivals conf [R, G]."""
        _, order = _ranked_candidates(_host_survival(conf))
        return _lens_from_order(order, capacity, conf.shape[0])

    def verified(self, request_ids: Sequence[Hashable], verify_lens, num_accepted) -> None:
        """This step's verified drafts per request, against what the lagged rows its capacity read
        promised (call before `observe` adds this step's rows). Feeds the lag calibration."""
        if self.calibration is None:
            return
        self.calibration.observe_many(self._groups(request_ids), self._lagged_conf(request_ids).numpy(),
                                      verify_lens, num_accepted)

    def observe(self, request_ids: Sequence[Hashable], conf: torch.Tensor) -> None:
        """Record this step's confidences; they inform the capacity `lag` steps later. A block cut
        short (conf [R, b], b < G) says nothing of positions b..: each request keeps what it last
        said of them (the prior where it has said nothing), so a short block never reads as a
        drafter that cannot go further."""
        conf = conf.detach().to("cpu", torch.float32)
        if conf.shape[1] < self.gamma:
            conf = self._filled(request_ids, conf)
        self._history_version += 1
        self.rows_observed += conf.shape[0]
        if self.prior == "observed":
            self._prior_sum += conf.sum(dim=0, dtype=torch.float64)
        for i, rid in enumerate(request_ids):
            self._history.setdefault(rid, deque(maxlen=self.lag)).append(conf[i])
            self._observed_at.setdefault(rid, deque(maxlen=self.lag)).append(self.clock)

    def _filled(self, request_ids: Sequence[Hashable], conf: torch.Tensor) -> torch.Tensor:
        """conf [R, b] extended to [R, G] by each request's latest row (or the prior) past b."""
        b = conf.shape[1]
        default = self._prior_row()
        rows = []
        for i, rid in enumerate(request_ids):
            hist = self._history.get(rid)
            last = hist[-1] if hist else default
            rows.append(torch.cat([conf[i], last[b:].to(torch.float32)]))
        return torch.stack(rows)

    def release(self, request_id: Hashable) -> None:
        self._history_version += 1
        self._history.pop(request_id, None)
        self._observed_at.pop(request_id, None)

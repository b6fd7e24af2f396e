"""The lag calibration (core/lag_calibration.py) inside SGLang's planner: the budget hook reads SGLang's
lagged rows as they have held up, and the step observer feeds what survived.

SGLang's budget hook gets `history_survival_probs` [R, G]: per request the cumulative product of its
confidence row from `SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS` steps back, or all ones where it has no
fresh row (SGLang's optimistic prior). `read` turns each row back into conditional confidences
(x_j = s_j / s_{j-1}), groups it (all ones: "prior", else "lag"; no "older": every SGLang decode step
drafts, so a fresh row is always the relay's lag old), corrects it and multiplies it out again.

Pairing a budget with its outcome. In SGLang 0.5.23 both scheduler modes run, on one thread, step N's
budget (overlap: `prepare_verify_budget` in `run_batch`; without: `resolve_verify_token_budget` in the
worker's forward), then `observe_verify_step` for step N from that forward, then step N+1's budget.
The observer gets the decision SGLang's planner kept (`last_decision`: the very object the hook
returned), so `planned` is keyed by that object; a step whose budget did not come through the hook
(a forced budget fraction, the overlap relay's copy not landed, verify-all) finds no entry and
teaches nothing, and without pairs the fit stays the identity (no correction).

Step N's outcome (accept lengths, verify lengths) is on the device when it is observed: under the
overlap scheduler it lands after step N+1's budget was computed. So it is staged then and applied
exactly OUTCOME_DELAY_STEPS observed steps later, waiting for the copy if it has not landed (by then
SGLang has read step N's results on the host, so it has): a count of steps, not "when the copy
landed", so every TP rank's fit holds the same outcomes at every budget. It is fed only from what
every rank shares: the survival matrix (broadcast drafts, replicated generations), SGLang's verify
lengths (TP-synced) and accept lengths (every rank commits the same tokens). Should the observer
hook step aside (guard.py), the fit keeps what it had learned.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

OUTCOME_DELAY_STEPS = 2  # observed steps between a step and its outcome reaching the fit (see above)
PLANNED_MAX = 4  # budgets awaiting their step's observation; in 0.5.23 there is one at a time
PRIOR, LAG = 0, 1  # core.lag_calibration.GROUPS


@dataclass
class PlannedStep:
    conf: torch.Tensor  # [R, G] the conditional confidences the budget read, uncorrected
    groups: list[int]
    survival: torch.Tensor  # [R, G] the corrected survival the decision read
    decision: object = None  # what the hook returned (SGLang's VerifyBudgetDecision)


def conditional(survival: torch.Tensor) -> torch.Tensor:
    """x_j = s_j / s_{j-1} (s_{-1} = 1); 0 after a zero survival, where the chain has ended."""
    survival = survival.to(torch.float32)
    previous = torch.cat([torch.ones_like(survival[:, :1]), survival[:, :-1]], dim=1)
    ratio = survival / previous.clamp(min=torch.finfo(torch.float32).tiny)
    return torch.where(previous > 0, ratio, torch.zeros_like(ratio)).clamp_(0.0, 1.0)


def row_groups(survival: torch.Tensor) -> list[int]:
    """SGLang's prior row is all ones; any other row is a fresh lagged one."""
    return torch.where((survival == 1.0).all(dim=1), PRIOR, LAG).tolist()


class LagFeed:
    """One per scheduler process: the fit, the budgets awaiting their step, the outcomes in flight."""

    def __init__(self, delay: int = OUTCOME_DELAY_STEPS):
        self.delay = delay
        self.calibration = None  # core.lag_calibration.LagCalibration, built at the first budget (gamma)
        # why a queue and not one slot: a budget whose step never reaches the observer must not be
        # taken for a later step's; entries before the one observed are such budgets, and dropped
        self.planned: deque[PlannedStep] = deque(maxlen=PLANNED_MAX)
        self.in_flight: deque[tuple[int, PlannedStep, object]] = deque()  # (due step, rows, staged outcome)
        self.observed_steps = 0

    def read(self, survival: torch.Tensor) -> PlannedStep:
        """The rows a budget reads, corrected; a row whose group has learned nothing yet is SGLang's
        own, bit for bit (x_j multiplied out again could differ in the last bit, and flip a tie)."""
        conf, groups = conditional(survival), row_groups(survival)
        calibration = self._calibration(survival.shape[1])
        corrected = torch.cumprod(calibration.correct(conf, groups), dim=1).to(survival.dtype)
        untaught = (calibration.coefficients() == torch.tensor([0.0, 1.0])).all(dim=1)[groups]
        return PlannedStep(conf, groups, torch.where(untaught.view(-1, 1), survival, corrected))

    def plan(self, step: PlannedStep, decision) -> None:
        step.decision = decision
        self.planned.append(step)

    def observe(self, decision, kw: dict, stage) -> None:
        """At observe_verify_step: apply the outcomes now due, then stage this step's (`stage`: the
        observer's non-blocking device-to-host copy, observer._Staged.stage)."""
        self.observed_steps += 1
        while self.in_flight and self.in_flight[0][0] <= self.observed_steps:
            _, step, staged = self.in_flight.popleft()
            self._learn(step, staged)
        step = self._pair(decision, kw)
        if step is not None:
            layout = kw.get("layout")
            staged = stage(correct_len=kw["correct_len"], verify_lens=getattr(layout, "verify_lens", None))
            self.in_flight.append((self.observed_steps + self.delay, step, staged))

    def _pair(self, decision, kw: dict) -> PlannedStep | None:
        if decision is None or not any(s.decision is decision for s in self.planned):
            return None
        while (step := self.planned.popleft()).decision is not decision:
            pass  # a budget whose step was never observed
        bs, budget = int(kw["bs"]), kw.get("verify_token_budget")
        return step if step.conf.shape[0] == bs and budget == getattr(decision, "budget", None) else None

    def _learn(self, step: PlannedStep, staged) -> None:
        staged.wait()
        rows = step.conf.shape[0]
        verify = staged.tensors["verify_lens"]
        # SGLang's verify lengths count rows, the anchor included; no layout: every draft verified
        drafts = (verify[:rows].to(torch.int64) - 1).clamp(min=0) if verify is not None else \
            torch.full((rows,), step.conf.shape[1], dtype=torch.int64)
        accepted = torch.minimum(staged.tensors["correct_len"][:rows].to(torch.int64), drafts)
        self.calibration.observe_many(step.groups, step.conf.numpy(), drafts.numpy(), accepted.numpy())

    def _calibration(self, gamma: int):
        if self.calibration is None or self.calibration.gamma != gamma:
            from sglang_dspark.core.lag_calibration import LagCalibration

            # `lag` only names ages for LagCalibration.group, unused here: rows are grouped by value
            self.calibration = LagCalibration(gamma, lag=1)
        return self.calibration


_FEED: tuple[object, LagFeed] | None = None


def feed() -> LagFeed:
    """The process's feed, for the settings it runs under (settings() is read once per process;
    a test that re-reads them starts a fresh fit)."""
    global _FEED
    from sglang_dspark.sglang_plugin.settings import settings

    current = settings()
    if _FEED is None or _FEED[0] is not current:
        _FEED = (current, LagFeed())
    return _FEED[1]

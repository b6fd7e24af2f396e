"""The step-observer hooks: AROUND `DsparkStepObservers.observe_verify_step`, AFTER `begin_step`.

Per decode step they export the reference server's `sglang_dspark_*` families (accepted length,
per-position acceptance, verify tokens, budget, predicted vs measured step time, per-user speed
against the SLA tier) into SGLang's multiprocess Prometheus registry, so they appear on SGLang's own
`/metrics` (`--enable-metrics`), and they feed the online SPS estimator when learning is on.

The tensors arrive on the device. Reading them now would stall the overlap scheduler, so each step
stages its device-to-host copies (non-blocking, with an event) and the next step reads them: the
numbers are one step late, never a synchronisation. Metrics come from attention-TP rank 0 only (the
other ranks see the same requests).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from sglang_dspark.sglang_plugin.settings import settings

REQUEST_SPEED_MIN_TOKENS = 2


@dataclass
class LearnedTable:
    ours: object  # sglang_dspark.core.sps.SpsTable
    table: object  # the same, as SGLang's SpsAdditiveCostTable


class _Staged:
    """Host copies of one step's device tensors, readable once `ready()`."""

    def __init__(self, tensors: dict, event):
        self.tensors, self.event = tensors, event

    @classmethod
    def stage(cls, **tensors):
        import torch

        on_device = any(t is not None and t.device.type != "cpu" for t in tensors.values())
        copies = {k: None if t is None else t.detach().to("cpu", non_blocking=on_device) for k, t in tensors.items()}
        event = None
        if on_device:
            event = torch.cuda.Event()
            event.record()
        return cls(copies, event)

    def ready(self) -> dict:
        if self.event is not None:
            self.event.synchronize()  # recorded a step ago: long done
        return self.tensors


class StepObserver:
    """One per scheduler process."""

    def __init__(self):
        self.metrics = None
        self.exporting = None  # decided at the first step (the parallel config is published by then)
        self.learner = None
        self.learned: LearnedTable | None = None
        self.began_at: float | None = None
        self.pending: tuple[_Staged, dict] | None = None
        self.requests: dict[str, list[float]] = {}  # rid -> [first seen, tokens, last seen]

    # -- hooks -----------------------------------------------------------------------------------
    def begin(self) -> None:
        self.began_at = time.perf_counter()

    def observe(self, planner, kw: dict, decision) -> None:
        now = time.perf_counter()
        if self.exporting is None:
            self._start()
        if self.pending is not None:
            staged, info = self.pending
            self._account(staged.ready(), info)
        layout = kw.get("layout")
        staged = _Staged.stage(commit_lens=kw.get("commit_lens"), correct_len=kw.get("correct_len"),
                               verify_lens=getattr(layout, "verify_lens", None))
        num_tokens = int(getattr(layout, "graph_num_tokens", 0) or kw["verify_ids_2d"].numel())
        info = {"bs": int(kw["bs"]), "num_tokens": num_tokens, "budget": kw.get("verify_token_budget"),
                "rids": [req.rid for req in kw.get("reqs") or []], "time": now,
                "seconds": None if self.began_at is None else now - self.began_at,
                "predicted": getattr(decision, "predicted_step_seconds", None)}
        self.pending = (staged, info)

    # -- internals -------------------------------------------------------------------------------
    def _start(self) -> None:
        import pkgutil

        from sglang_dspark.sglang_plugin.targets import PARALLEL

        parallel = pkgutil.resolve_name(PARALLEL)()
        single_rank = getattr(parallel, "attn_tp_size", 1) == 1
        self.exporting = getattr(parallel, "attn_tp_rank", 0) == 0 and bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        if self.exporting:
            from sglang_dspark.metrics import EngineMetrics

            self.metrics = EngineMetrics(gauge_mode="mostrecent")
        plugin = settings()
        if plugin.learning:
            if not single_rank:
                import logging

                logging.getLogger(__name__).warning(
                    "SGLANG_DSPARK_SPS_LEARNING ignored: with attention TP > 1 each rank would learn its own "
                    "table and pick its own CUDA-graph size; the profile's table is used")
            else:
                from sglang_dspark.core.sps_online import OnlineSpsEstimator

                from sglang_dspark.sglang_plugin.planner import profile_table

                self.learner = OnlineSpsEstimator(prior=profile_table() if plugin.profile is not None else None)

    def _account(self, host: dict, info: dict) -> None:
        commit, correct, verify = host["commit_lens"], host["correct_len"], host["verify_lens"]
        bs, seconds = info["bs"], info["seconds"]
        if self.learner is not None and seconds:
            self.learner.observe(bs, info["num_tokens"], True, seconds)  # SGLang's step always drafts
            self._refresh_learned()
        if self.metrics is None:
            return
        m = self.metrics
        m.verify_steps.inc()
        m.verify_tokens.observe(info["num_tokens"])
        if info["budget"] is not None:
            m.budget.observe(int(info["budget"]))
        if seconds:
            m.observe_step(seconds, info["predicted"])
        if commit is not None:
            for n in commit[:bs].tolist():
                m.accept_length.observe(int(n))
            m.generation_tokens.inc(int(commit[:bs].sum()))
        if correct is not None and verify is not None:
            gamma = int(verify.max()) if verify.numel() else 0
            accepted = correct[:bs].view(-1, 1) > _positions(gamma)
            verified = verify[:bs].view(-1, 1) > _positions(gamma)
            m.observe_positions(verified.sum(0).tolist(), (accepted & verified).sum(0).tolist())
        self._track_requests(info, commit)

    def _track_requests(self, info: dict, commit) -> None:
        """Per-user speed, (tokens - 1) / (last - first) over the decode steps a request was in; a
        request that is no longer in the batch has finished."""
        tier = settings().tier
        now, seen = info["time"], set(info["rids"])
        for rid, n in zip(info["rids"], (commit.tolist() if commit is not None else [1] * len(info["rids"]))):
            state = self.requests.setdefault(rid, [now, 0, now])
            state[1] += int(n)
            state[2] = now
        for rid in [r for r in self.requests if r not in seen]:
            first, tokens, last = self.requests.pop(rid)
            if tier is not None and tokens >= REQUEST_SPEED_MIN_TOKENS and last > first:
                met = (tokens - 1) / (last - first) >= tier.tok_s_per_user
                self.metrics.sla_requests.labels(outcome="met" if met else "missed").inc()

    def _refresh_learned(self) -> None:
        table = self.learner.table()
        if table is None or not self.learner.has_drafted or (self.learned is not None and self.learned.ours is table):
            return
        import pkgutil

        from sglang_dspark.sglang_plugin.targets import ADDITIVE_TABLE

        sglang_table = pkgutil.resolve_name(ADDITIVE_TABLE)(**table.table.model_dump())
        self.learned = LearnedTable(ours=table, table=sglang_table)


def _positions(gamma: int):
    import torch

    return torch.arange(gamma).view(1, -1)


_OBSERVER: StepObserver | None = None


def observer() -> StepObserver:
    global _OBSERVER
    if _OBSERVER is None:
        _OBSERVER = StepObserver()
    return _OBSERVER


def learned_table() -> LearnedTable | None:
    return observer().learned


def after_begin_step(result, observers) -> None:
    observer().begin()


def around_observe_step(original_fn, observers, **kw):
    planner = getattr(getattr(observers, "_planner", None), "_budget_planner", None)
    decision = getattr(planner, "last_decision", None)  # read before the info dumper consumes it
    result = original_fn(observers, **kw)
    observer().observe(planner, kw, decision)
    return result

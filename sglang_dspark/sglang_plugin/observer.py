"""The step-observer hooks: AROUND `DsparkStepObservers.observe_verify_step`, AFTER
`note_prefill_step` and AFTER `DsparkStepObservers.__init__`.

Per decode step they export the reference server's `sglang_dspark_*` families (accepted length,
per-position acceptance, verify tokens, budget, predicted vs measured step time, per-user speed
against the SLA tier, the SPS table in use) into SGLang's multiprocess Prometheus registry, so they
appear on SGLang's own `/metrics` (`--enable-metrics`), and they feed the online SPS estimator when
learning is on and the lag calibration when it is on (lag.py, on every rank).

Step time is what SGLang's own records call `step_cpu_ms` (and what `profile capture-http` reads
when SGLang records no GPU time): the interval between consecutive decode steps, none across a
prefill step or beyond MAX_STEP_SECONDS. It is paired with the step that produced it: under overlap
scheduling (SGLang's default) the hook for step N runs once step N is launched, and the interval
ending at step N+1's hook is what step N's forward kept the device busy, so it is step N's; with
`--disable-overlap-schedule` each step runs before its hook, and the interval ending there is its
own. (Pairing step N's tokens with step N-1's time smears theta(B) when budgets vary.)

The tensors arrive on the device. Reading them now would stall the overlap scheduler, so each step
stages its device-to-host copies (non-blocking, with an event) and a later step reads them once the
event says they landed: the numbers are a step or more late, never a synchronisation. The learned
table is refitted from a snapshot taken here, in a worker process of its own (fitter.py: a fit on a
thread here would hold the GIL the scheduler thread needs); until that worker is up, or after it
died, on a background thread. Metrics come from attention-TP rank 0 only (the other ranks see the
same requests).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sglang_dspark.sglang_plugin import guard
from sglang_dspark.sglang_plugin.settings import profile_table, refuse_inert_planner, settings

logger = logging.getLogger(__name__)

REQUEST_SPEED_MIN_TOKENS = 2
STALE_SECONDS = 600.0  # a request absent this long without a finish is forgotten
MAX_STEP_SECONDS = 1.0  # SGLang's INFO_DUMP_MAX_STEP_CPU_SECONDS: a longer gap is idle time, not a step
# The reference server's families this observer updates, and only those: a family created here and
# never updated would read 0 on SGLang's /metrics (guard blocks, canary mismatches: "healthy"), not
# "no data". test_sglang_plugin checks every one is updated by a step.
FAMILIES = frozenset({
    "sglang_dspark_accept_length", "sglang_dspark_position_verified", "sglang_dspark_position_accepted",
    "sglang_dspark_verify_budget", "sglang_dspark_sla_requests", "sglang_dspark_verify_tokens",
    "sglang_dspark_step_seconds", "sglang_dspark_predicted_step_seconds", "sglang_dspark_step_time_abs_rel_error",
    "sglang_dspark_generation_tokens", "sglang_dspark_verify_steps", "sglang_dspark_sps_table_source"})


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

        device = next((t.device for t in tensors.values() if t is not None and t.device.type != "cpu"), None)
        copies = {k: None if t is None else t.detach().to("cpu", non_blocking=device is not None)
                  for k, t in tensors.items()}
        event = None
        if device is not None:  # CUDA, or the NPU / XPU that SGLang's DSpark also runs on
            event = torch.get_device_module(device).Event()
            event.record()
        return cls(copies, event)

    def ready(self) -> bool:
        return self.event is None or self.event.query()  # never waits on the device

    def wait(self) -> None:
        """Until the copies landed (lag.py: only for copies SGLang has already read back itself)."""
        if self.event is not None:
            self.event.synchronize()


class StepObserver:
    """One per scheduler process."""

    def __init__(self):
        self.metrics = None
        self.exporting = None  # decided at the first step (the parallel config is published by then)
        self.learner = None
        self.learned: LearnedTable | None = None
        self.last_stamp: float | None = None  # the previous decode step's, None after a prefill
        self.overlapped = True  # SGLang's overlap scheduler (decided at the first step)
        self.last_info: dict | None = None  # the previous decode step's, waiting for its time (overlap)
        self.pending: list[tuple[_Staged, dict]] = []  # staged steps whose copies have not landed
        self.requests: dict[str, list[float]] = {}  # rid -> [first seen, tokens, last seen]
        self.finished: set[str] = set()  # rids SGLang reported finished, outcome due once no step holds them
        self.aborted: dict[str, float] = {}  # rid prefixes SGLang was asked to abort -> when (no SLA outcome)
        self.aborted_all_at: float | None = None  # the last abort_all: requests seen before it get no outcome
        self._refit: Future | None = None  # a refit on the fallback thread
        self._fitter: ThreadPoolExecutor | None = None
        self.worker = None  # fitter.FitWorker: where refits run while it lives
        self.export: tuple | None = None  # (path, meta, seconds between writes) of the learned table's file
        self._exporter = None  # the fallback thread's export.Exporter

    # -- hooks -----------------------------------------------------------------------------------
    def note_prefill(self) -> None:
        self.last_stamp = self.last_info = None  # the next interval holds a prefill: no decode step's cost

    def observe(self, planner, kw: dict, decision) -> None:
        now = time.perf_counter()
        if self.exporting is None:
            self._start()
        if settings().lag_calibration:  # on every rank: each one's budget reads the fit
            from sglang_dspark.sglang_plugin import lag

            lag.feed().observe(decision, kw, _Staged.stage)
        if self.metrics is None and self.learner is None:
            return  # nothing here reads the step (another attention-TP rank, or no metrics): stage nothing
        seconds = None if self.last_stamp is None else now - self.last_stamp
        self.last_stamp = now
        if seconds is not None and not 0.0 < seconds <= MAX_STEP_SECONDS:
            seconds = None
        if self.overlapped and self.last_info is not None:
            self.last_info["seconds"], seconds = seconds, None  # the previous step's; this one's comes next
        while self.pending and self.pending[0][0].ready():
            staged, info = self.pending.pop(0)
            self._account(staged.tensors, info)
        layout = kw.get("layout")
        staged = _Staged.stage(commit_lens=kw.get("commit_lens"), correct_len=kw.get("correct_len"),
                               verify_lens=getattr(layout, "verify_lens", None))
        bs = int(kw["bs"])
        rows_per_request = int(kw["verify_ids_2d"].numel()) // max(1, bs)  # static verify: anchor + gamma
        info = {"bs": bs, "gamma": rows_per_request - 1,
                "graph_tokens": int(getattr(layout, "graph_num_tokens", 0) or kw["verify_ids_2d"].numel()),
                "budget": kw.get("verify_token_budget"), "rids": [req.rid for req in kw.get("reqs") or []],
                "time": now, "seconds": seconds, "predicted": getattr(decision, "predicted_step_seconds", None),
                "source": self._source(planner)}
        self.pending.append((staged, info))
        self.last_info = info

    # -- internals -------------------------------------------------------------------------------
    def _start(self) -> None:
        import pkgutil

        from sglang_dspark.sglang_plugin.targets import PARALLEL

        parallel = pkgutil.resolve_name(PARALLEL)()
        self.overlapped = not _overlap_disabled()
        single_rank = getattr(parallel, "attn_tp_size", 1) == 1
        self.exporting = getattr(parallel, "attn_tp_rank", 0) == 0 and bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        if self.exporting:
            from sglang_dspark.metrics import EngineMetrics

            self.metrics = EngineMetrics(gauge_mode="mostrecent", families=FAMILIES)
        plugin = settings()
        if plugin.learning:
            if not single_rank:
                logger.warning("SGLANG_DSPARK_SPS_LEARNING ignored: with attention TP > 1 each rank would learn its "
                               "own table and pick its own CUDA-graph size; the profile's table is used")
            else:
                from sglang_dspark.core.sps_online import OnlineSpsEstimator

                self.learner = OnlineSpsEstimator(prior=profile_table() if plugin.profile is not None else None)
                self.export = _export(plugin, parallel)
                self._start_worker()

    def _start_worker(self) -> None:
        from sglang_dspark.sglang_plugin.fitter import FitWorker

        try:
            self.worker = FitWorker(self.learner, self.export)
        except Exception:  # noqa: BLE001 - no worker process here: refits stay on a thread
            logger.exception("online SPS fit worker did not start; refits run on a thread of the scheduler process")

    def _source(self, planner) -> str:
        """The table SGLang's planner prices this step with, as the reference server names it."""
        if getattr(planner, "is_verify_all", False):
            return "flat"  # no SPS table: SGLang verifies every draft
        return "profile+online" if self.learned is not None else "profile"

    def _account(self, host: dict, info: dict) -> None:
        commit, correct, verify = host["commit_lens"], host["correct_len"], host["verify_lens"]
        bs, seconds, gamma = info["bs"], info["seconds"], info["gamma"]
        # SGLang's verify_lens count rows, the anchor included; static verify has no layout: all of them
        drafts = (verify[:bs] - 1).clamp(min=0) if verify is not None else None
        verify_tokens = bs + (int(drafts.sum()) if drafts is not None else bs * gamma)
        if self.learner is not None and seconds:
            self.learner.observe(bs, info["graph_tokens"], True, seconds)  # SGLang's step always drafts
            self._refresh_learned()
        if self.metrics is None:
            return
        from sglang_dspark.metrics import observe_many  # prometheus_client only once metrics exist

        m = self.metrics
        m.verify_steps.inc()
        m.verify_tokens.observe(verify_tokens)
        for source in ("flat", "profile", "profile+online"):
            m.sps_source.labels(source=source).set(1.0 if source == info["source"] else 0.0)
        if info["budget"] is not None:
            m.budget.observe(int(info["budget"]))
        if seconds:
            m.observe_step(seconds, info["predicted"])
        if commit is not None:
            observe_many(m.accept_length, commit[:bs].numpy())  # one write per bucket, not per request
            m.generation_tokens.inc(int(commit[:bs].sum()))
        if correct is not None and gamma > 0:
            positions = _positions(gamma)
            verified = (drafts.view(-1, 1) if drafts is not None else torch_full(bs, gamma)) > positions
            accepted = correct[:bs].view(-1, 1) > positions
            m.observe_positions(verified.sum(0).tolist(), (accepted & verified).sum(0).tolist())
        self._track_requests(info, commit)

    def note_finished(self, rid: str) -> None:
        self.finished.add(rid)

    def note_aborted(self, rid: str, abort_all: bool) -> None:
        """SGLang's Scheduler.abort_request ends every request whose rid starts with `rid` (all of
        them with `abort_all`): a client that left, not a speed the tier promised, as the reference
        engine counts it (an aborted request gets no SLA outcome)."""
        now = time.perf_counter()
        if abort_all:
            self.aborted_all_at = now
        else:
            self.aborted[rid] = now
            if len(self.aborted) > 1024:  # prefixes of requests long gone
                self.aborted = {r: t for r, t in self.aborted.items() if now - t <= STALE_SECONDS}

    def _was_aborted(self, rid: str, first_seen: float) -> bool:
        if self.aborted_all_at is not None and self.aborted_all_at >= first_seen:
            return True
        return bool(self.aborted) and any(rid.startswith(prefix) for prefix in self.aborted)

    def shutdown(self, timeout: float = 5.0) -> None:
        """At the scheduler's shutdown: adopt a refit in flight, write the learned table now (not
        up to EXPORT_SECONDS late), and stop the fit worker, waited for (no process left behind)."""
        if self.learner is None:
            return
        try:
            self.settle(timeout)
        except Exception:  # noqa: BLE001 - a failed last fit keeps the table in use
            logger.exception("online SPS refit at shutdown failed; exporting the current table")
        if self.worker is not None:
            self.worker.close(timeout)
        if self.export is not None and self.learned is not None:
            from sglang_dspark.sglang_plugin.export import Exporter

            Exporter(*self.export).write(self.learned.ours, self.learner.snapshot(), self.learner.steps)

    def _track_requests(self, info: dict, commit) -> None:
        """Per-user speed, (tokens - 1) / (last - first) over the decode steps a request was in,
        once SGLang reports it finished (note_request_finished) and no later step holds it: a request
        missing from a step may be retracted and come back, so absence alone finishes nothing. One
        absent STALE_SECONDS without a finish (an abort that never reported) is forgotten, no outcome."""
        tier = settings().tier
        now, seen = info["time"], set(info["rids"])
        for rid, n in zip(info["rids"], (commit.tolist() if commit is not None else [1] * len(info["rids"]))):
            state = self.requests.setdefault(rid, [now, 0, now])
            state[1] += int(n)
            state[2] = now
        for rid in [r for r in self.requests if r not in seen and (r in self.finished or
                                                                   now - self.requests[r][2] > STALE_SECONDS)]:
            first, tokens, last = self.requests.pop(rid)
            if (rid in self.finished and tier is not None and tokens >= REQUEST_SPEED_MIN_TOKENS and last > first
                    and not self._was_aborted(rid, first)):
                met = (tokens - 1) / (last - first) >= tier.tok_s_per_user
                self.metrics.sla_requests.labels(outcome="met" if met else "missed").inc()
            self.finished.discard(rid)
        if len(self.finished) > 4 * len(self.requests) + 1024:  # finishes of requests never seen here
            self.finished &= set(self.requests)

    def _refresh_learned(self) -> None:
        """Adopt a finished refit; start the next one when due (never waits here)."""
        if self.worker is not None and self.worker.busy:
            message = self.worker.poll()
            if message is not None:
                self._adopt_worker(message)
            elif not self.worker.dead:
                return  # still fitting
        if self._refit is not None:
            if not self._refit.done():
                return
            refit, self._refit = self._refit, None
            try:
                table, steps = refit.result()
            except Exception:  # a bad fit keeps the table in use
                logger.exception("online SPS refit failed; keeping the current table")
            else:
                self._adopt(table, steps)
        if self.learner.refit_due:
            samples, steps, learner = self.learner.snapshot(), self.learner.steps, self.learner
            if self.worker is not None and self.worker.submit(samples, steps):
                return
            if self._fitter is None:  # the worker is starting, or gone
                self._fitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dspark-sps-fit")
                if self.export is not None:
                    from sglang_dspark.sglang_plugin.export import Exporter

                    self._exporter = Exporter(*self.export)
            self._refit = self._fitter.submit(_fit_and_export, learner, samples, steps, self._exporter)

    def _adopt_worker(self, message: tuple) -> None:
        if message[0] == "error":
            logger.error("online SPS refit failed in the fit worker; keeping the current table:\n%s", message[1])
            return
        _, table, steps, self.learner.prior_scale, self.learner.prior_draft_scale = message
        self._adopt(table, steps)

    def _adopt(self, table, steps: int) -> None:
        self.learner.adopt(table, steps)
        self._publish(table)

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for the refit in flight, if any, and adopt it (tests and benchmarks; never a hook)."""
        if self.worker is not None and self.worker.busy:
            message = self.worker.poll(timeout)
            if message is not None:
                self._adopt_worker(message)
        if self._refit is not None:
            self._refit.result(timeout=timeout)
            self._refresh_learned()

    def _publish(self, table) -> None:
        if table is None or not self.learner.has_drafted or (self.learned is not None and self.learned.ours is table):
            return
        import pkgutil

        from sglang_dspark.sglang_plugin.targets import ADDITIVE_TABLE

        sglang_table = pkgutil.resolve_name(ADDITIVE_TABLE)(**table.table.model_dump())
        self.learned = LearnedTable(ours=table, table=sglang_table)


def _fit_and_export(learner, samples, steps: int, exporter) -> tuple:
    """On the fallback thread: the fit, then the learned table's file when one is due."""
    table = learner.fit(samples)
    if exporter is not None:
        exporter.maybe_write(table, samples, steps)
    return table, steps


def _export(plugin, parallel) -> tuple | None:
    """Exporter's arguments for this process's learned-table file, None without an export directory."""
    if plugin.export_dir is None:
        return None
    from sglang_dspark.sglang_plugin import export

    profile, dp_rank = plugin.profile, getattr(parallel, "dp_rank", None) or 0
    meta = {"dp_rank": dp_rank, "profile": os.environ.get("SGLANG_DSPARK_PROFILE"),
            "dspark_fingerprint": profile.fingerprint.model_dump(mode="json") if profile is not None else None,
            "sts_temperatures": profile.sts.temperatures if profile is not None and profile.sts else None,
            "max_batch_tokens": profile.sps.cost.max_batch_tokens if profile is not None else None}
    return str(export.learned_path(plugin.export_dir, dp_rank)), meta, export.EXPORT_SECONDS


def _overlap_disabled() -> bool:
    """SGLang's --disable-overlap-schedule, as published to this scheduler process (overlap, its
    default, where it cannot be read)."""
    import pkgutil

    from sglang_dspark.sglang_plugin.targets import SCHEDULE

    try:
        return bool(pkgutil.resolve_name(SCHEDULE)().disable_overlap_schedule)
    except (RuntimeError, ValueError, AttributeError):
        return False


def torch_full(bs: int, gamma: int):
    import torch

    return torch.full((bs, 1), gamma)


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


OBSERVER_HOOK = "observe_verify_step"  # guard.py's name for the observer's hooks, which step aside together


def _observe_guarded(action) -> None:
    """Run an observer hook's body unless the observer stepped aside; a failure makes it step aside."""
    if guard.is_off(OBSERVER_HOOK):
        return
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - guard.py: a metrics hook never ends SGLang's scheduler
        guard.failed(OBSERVER_HOOK, exc, step_aside=True)


def after_prefill_step(result, observers) -> None:
    _observe_guarded(lambda: observer().note_prefill())


def after_request_finished(result, observers, *, rid: str, natural_stop: bool) -> None:
    """AFTER DsparkStepObservers.note_request_finished: the request is done (not retracted)."""
    _observe_guarded(lambda: observer().note_finished(rid))


def after_abort_request(result, scheduler, recv_req, *args, **kwargs) -> None:
    """AFTER Scheduler.abort_request(AbortReq): those requests end without an SLA outcome."""
    _observe_guarded(lambda: observer().note_aborted(recv_req.rid or "", bool(getattr(recv_req, "abort_all", False))))


def after_scheduler_shutdown(*_args, **_kwargs) -> None:
    """AFTER Scheduler.release_host_resources: the STS recorders' last partial shards, the learned
    table's file, and the fit worker's exit."""
    from sglang_dspark.sglang_plugin import sts

    try:
        sts.flush_all()
    except Exception as exc:  # noqa: BLE001 - the shutdown goes on; what could not be flushed is logged
        guard.failed("release_host_resources", exc, step_aside=False)
    if _OBSERVER is not None:
        _observe_guarded(_OBSERVER.shutdown)


def after_observers_init(result, observers, *args, **kwargs) -> None:
    """AFTER DsparkStepObservers.__init__: read the plugin's settings now, so that a bad profile or
    tier stops the worker at start (before a router sends it traffic), not at its first decode step;
    refuse a tier or learning SGLang's planner would never consult, and STS collection in compact mode."""
    from sglang_dspark.sglang_plugin.sts import refuse_compact_collection

    settings()
    refuse_inert_planner(observers)
    refuse_compact_collection(result, observers, *args, **kwargs)


def around_observe_step(original_fn, observers, **kw):
    """SGLang's own observers run (and raise) as without the plugin; ours run after, guarded."""
    planner = getattr(observers, "_planner", None)
    budget_planner = getattr(planner, "_budget_planner", None)
    decision = getattr(budget_planner, "last_decision", None)  # read before the info dumper consumes it
    result = original_fn(observers, **kw)
    _observe_guarded(lambda: observer().observe(planner, kw, decision))
    return result

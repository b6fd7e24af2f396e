"""The reference engine: continuous batching with DSpark speculative decoding on PyTorch.

`step()` reads as nano-vllm's does:

    schedule     admission into free KV slots, prefill chunks, the decode step's capacity
    run          prefill forward; draft, STS, top-K allocation, ONE ragged verify forward,
                 rejection sampling
    postprocess  commit accepted tokens and the correction/bonus token, stops, outputs
    record       the step record, metrics, feedback to the speculation policy

The engine is single-threaded: `AsyncEngine` (engine/async_engine.py) owns the thread and the inbox
a server talks through. Modes: "target" (no speculation), "full" (verify every draft), "scheduled"
(the speculation policy's per-step capacity; a flat SPS table means verify-all).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from sglang_dspark.core.calibration import apply_sts
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine.canary import MISMATCH, NEAR_TIE, Canary, Replay, divergence_margin, replay_params
from sglang_dspark.engine.grammar import GrammarState, constrain_ragged, constrain_rows, grammar_draft_sampler
from sglang_dspark.engine.heap import release_freed_memory
from sglang_dspark.engine.isolation import EngineFault, culprits, failing, requests_of, restricted
from sglang_dspark.engine.logprobs import token_logprobs
from sglang_dspark.engine.model_runner import DecodeRow, ModelRunner
from sglang_dspark.engine.output import OutputProcessor
from sglang_dspark.engine.policy import NO_DRAFT, DraftPlan, SpeculationPolicy
from sglang_dspark.engine.records import StepRecord, StepRecords
from sglang_dspark.engine.request import ContextLengthError, Request, RequestOutput
from sglang_dspark.engine.sampling import SamplingBatch, SamplingParams
from sglang_dspark.engine.scheduler import PrefillChunk, ScheduledBatch, Scheduler
from sglang_dspark.engine.target_model import ROPE_HEADROOM, TargetModel
from sglang_dspark.engine.verification import verify_step
from sglang_dspark.metrics import EngineMetrics

logger = logging.getLogger(__name__)

# Verify sizes a step is snapped up to: CUDA-graph buckets on a GPU, the same logic on a CPU.
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
QUEUE_PER_SLOT = 8  # the default queue bound, in requests per KV slot
SLA_MIN_TOKENS = 8  # a running request's measured speed counts for SLA admission from this many tokens

RoundObserver = Callable[[str, int, int, torch.Tensor], None]


@dataclass
class EngineConfig:
    mode: str = "scheduled"
    max_running: int = 16  # KV slots
    max_len: int | None = None  # context per request (prompt + output); None: the model's own
    prefill_chunk: int = 256  # prompt tokens per step, over all prefilling requests
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    lag: int = 2  # the planner's confidence lag in steps (SGLang's relay lag)
    seed: int = 0
    sla_tok_s_per_user: float | None = None  # SLA mode: capacity keeps every user above this speed
    learn_sps: bool = True  # scheduled mode: learn the SPS table from this engine's steps (engine/policy.py)
    probe_every: int = 32  # when drafting does not pay, still draft every n-th step to re-measure,
    probe_max: int = 256  # doubling the interval after each probe that changes nothing, up to this
    max_records: int = 4096  # per-step records kept for /server_info
    canary_share: float = 0.0  # greedy requests replayed without speculation and compared (engine/canary.py)
    canary_dir: str | None = None  # where mismatching replays are kept as evidence
    # requests waiting for a slot, at most (SGLang's --max-queued-requests); None: QUEUE_PER_SLOT per slot
    max_queued_requests: int | None = None


@dataclass
class PrefillResult:
    chunks: list[PrefillChunk]
    last_logits: torch.Tensor  # [len(chunks), V]: each chunk's last position
    first_tokens: dict[int, int] = field(default_factory=dict)  # chunk index -> first output token
    # chunk index -> logits [len(chunk), V] of its every position, for requests with prompt_logprobs
    chunk_logits: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class DecodeResult:
    requests: list[Request]
    rows: list[DecodeRow]
    plan: DraftPlan
    lens: torch.Tensor  # drafts verified per request
    num_accepted: torch.Tensor
    next_tokens: torch.Tensor  # correction or bonus token per request
    drafts: torch.Tensor | None  # [R, G] when the drafter ran
    conf: torch.Tensor | None  # calibrated confidences [R, G]
    conf_logits: torch.Tensor | None  # raw [R, G]
    logits: torch.Tensor  # ragged verify logits [sum(1 + lens), V]
    hidden: torch.Tensor | None  # ragged captured hidden states
    start: float
    drafted_at: float
    verified_at: float
    end: float = 0.0  # set once committed


@dataclass
class StepResult:
    prefill: PrefillResult | None
    decode: DecodeResult | None


class Engine:
    def __init__(self, target: TargetModel, tokenizer, drafter=None, *, config: EngineConfig | None = None,
                 sps: SpsTable | None = None, sts_temperatures: torch.Tensor | None = None,
                 model_name: str = "model", clock: Callable[[], float] = time.perf_counter,
                 sps_seeded: bool = False, identity: dict | None = None, model_path: str | None = None):
        self.config = config = config or EngineConfig()
        if config.mode != "target" and drafter is None:
            raise ValueError(f"mode {config.mode!r} needs a drafter")
        drafter = drafter if config.mode != "target" else None
        self.target, self.tokenizer, self.model_name, self.clock = target, tokenizer, model_name, clock
        self.model_path = model_path or model_name  # the target's directory: a router loads its tokenizer from it
        self.gamma = drafter.gamma if drafter is not None else 0
        model_len = int(target.config.max_position_embeddings)
        self.max_len = min(config.max_len or model_len, model_len)  # prompt + output, per request
        queued = config.max_queued_requests
        if queued is not None and queued < 0:
            raise ValueError(f"max_queued_requests: must be >= 0, got {queued}")
        # requests running or waiting, at most: more are refused at admission (AsyncEngine.submit)
        self.max_in_flight = config.max_running + (QUEUE_PER_SLOT * config.max_running if queued is None else queued)
        if self.gamma + 1 > ROPE_HEADROOM:
            raise ValueError(f"gamma {self.gamma}: blocks longer than {ROPE_HEADROOM - 1} drafts are not supported")
        # each slot also holds one draft block beyond the last token
        self.runner = ModelRunner(target, drafter, config.max_running, self.max_len + self.gamma + 1)
        self.sts = sts_temperatures
        self.policy = SpeculationPolicy(
            config.mode, self.gamma, sps, learn=config.learn_sps, seeded=sps_seeded,
            max_batch_tokens=config.max_running * (self.gamma + 1), lag=config.lag, buckets=config.buckets,
            sla_tok_s_per_user=config.sla_tok_s_per_user, probe_every=config.probe_every,
            probe_max=config.probe_max, clock=clock)
        self.identity = identity or {}  # what /server_info says this deployment is (a profile's fingerprint)
        self.scheduler = Scheduler(config.max_running, config.prefill_chunk)
        self.output = OutputProcessor(tokenizer, _eos_ids(tokenizer, target))
        self.metrics = EngineMetrics()
        self.records = StepRecords(config.max_records)
        self._generator = torch.Generator().manual_seed(config.seed)
        self._ids = itertools.count()
        self._round_observers: list[RoundObserver] = []
        self._last_emit: dict[str, float] = {}
        self.canary = Canary(config.canary_share, config.canary_dir)
        self.threads = None  # engine/threads.py EngineThreads, set by a launch that named its thread

    # ---- requests ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """The checks `submit` makes, without submitting (safe from any thread)."""
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_len:
            raise ContextLengthError(f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                             f"the context limit of {self.max_len} tokens")

    def submit(self, prompt_ids, params: SamplingParams, callback: Callable[[RequestOutput], None],
               request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        self.validate(prompt_ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self.scheduler:
            raise ValueError(f"rid: a request with id {rid!r} is already in flight")
        self.scheduler.add(self._constrained(Request(rid, prompt_ids, params, callback, arrival=self.clock())))
        return rid

    def _constrained(self, req: Request) -> Request:
        """The request with its own grammar matcher when its params carry a grammar."""
        if req.params.grammar is not None:
            req.grammar = GrammarState(req.params.grammar, self.output.eos_ids, max_rollback=self.gamma + 1)
        return req

    def abort(self, request_id: str) -> None:
        req = self.scheduler.remove(request_id)
        if req is not None:
            self.output.abort(req)  # first: releasing reads finish_reason (a cut replay is no mismatch)
            self._release(req)

    def fail(self, request_id: str, message: str) -> None:
        """End a request whose processing failed: its final output carries `message` as its error."""
        req = self.scheduler.remove(request_id)
        if req is not None:
            self.output.fail(req, message)
            self._release(req)

    def abort_all(self) -> None:
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            self.abort(req.id)

    def add_round_observer(self, observer: RoundObserver) -> Callable[[], None]:
        """Call `observer(request_id, accepted, verified, raw conf logits [G])` after every drafted
        round (offline evaluation reads acceptance and calibration data through it); returns the
        function that removes it again."""
        self._round_observers.append(observer)
        return lambda: self._round_observers.remove(observer)

    # ---- one step ------------------------------------------------------------------------------
    def step(self) -> None:
        """One iteration: schedule, run, postprocess, record."""
        batch, plan = self.schedule()
        if not batch.empty:
            result = self.run(batch, plan)
            if result is not None:
                self.postprocess(result)
                self.record(result)
        self.update_gauges()

    def run(self, batch: ScheduledBatch, plan: DraftPlan) -> StepResult | None:
        """The step's forwards and sampling; a run that raises is re-run on parts of the batch until
        the requests that fail alone are found (engine/isolation.py): they end, the rest runs (None
        when nothing is left). EngineFault when no single request explains the failure."""
        try:
            return self._run_batch(batch, plan)
        except Exception as exc:
            first = exc
        try:
            found = culprits(batch, failing(lambda part: self._run_batch(part, plan)))
        except EngineFault as fault:
            self.metrics.engine_faults.inc()
            raise EngineFault(f"{fault}; the step raised {type(first).__name__}: {first}") from first
        for req in found:
            logger.error("request %s ended: a step fails with it and runs without it (%s: %s)", req.id,
                         type(first).__name__, first)
            self.metrics.request_faults.labels(kind=type(first).__name__).inc()
            self.fail(req.id, f"the engine could not process this request ({type(first).__name__}: {first})")
        rest = restricted(batch, [r for r in requests_of(batch) if r not in found])
        return None if rest.empty else self._run_batch(rest, plan)

    def schedule(self) -> tuple[ScheduledBatch, DraftPlan]:
        if not self.scheduler.waiting and self.scheduler.has_free_slot:  # spare capacity: a canary replay
            replay = self.canary.next_request(self._replay_request)
            if replay is not None:
                self.scheduler.add(replay)
        batch = self.scheduler.schedule(self._admits)
        plan = self.policy.plan([r.id for r in batch.decode]) if batch.decode else NO_DRAFT
        return batch, plan

    def _run_batch(self, batch: ScheduledBatch, plan: DraftPlan) -> StepResult:
        return StepResult(self._run_prefill(batch.prefill) if batch.prefill else None,
                          self._run_decode(batch.decode, plan) if batch.decode else None)

    def postprocess(self, result: StepResult) -> None:
        if result.prefill is not None:
            self._commit_prefill(result.prefill)
        if result.decode is not None:
            self._commit_decode(result.decode)

    def record(self, result: StepResult) -> None:
        d = result.decode
        if d is None:
            return
        ids = [r.id for r in d.requests]
        R, drafted = len(d.rows), d.drafts is not None
        num_tokens = R + int(d.lens.sum())
        if drafted:
            self.policy.observe(ids, d.conf, d.lens, d.num_accepted)
            for i, rid in enumerate(ids):
                for observer in self._round_observers:
                    observer(rid, int(d.num_accepted[i]), int(d.lens[i]), d.conf_logits[i])
        emitted = int(d.num_accepted.sum()) + R
        blocks = self.policy.guard.blocks
        predicted = self.policy.on_step(d.plan, R, num_tokens, emitted, drafted, d.start, d.end)
        self.metrics.observe_policy(self.policy, d.plan.probe, self.policy.guard.blocks - blocks)
        step_s = d.end - d.start
        self.metrics.observe_step(step_s, predicted)
        self.metrics.verify_tokens.observe(num_tokens)
        self.metrics.budget.observe(d.plan.capacity)
        self.metrics.verify_steps.inc()
        if drafted:  # an undrafted step verifies and accepts no position: nothing to count
            verified = [int((d.lens > k).sum()) for k in range(self.gamma)]
            accepted = [int((d.num_accepted > k).sum()) for k in range(self.gamma)]
            self.metrics.observe_positions(verified, accepted)
        self.records.append(StepRecord(
            bs=R, budget=d.plan.capacity, num_verify_tokens=num_tokens, accepted_drafts=int(d.num_accepted.sum()),
            drafted=drafted, probe=d.plan.probe, predicted_step_ms=None if predicted is None else round(predicted * 1e3, 3),
            step_ms=round(step_s * 1e3, 3), draft_ms=round((d.drafted_at - d.start) * 1e3, 3),
            target_verify_ms=round((d.verified_at - d.drafted_at) * 1e3, 3), time=time.time()))

    def update_gauges(self) -> None:
        self.metrics.running.set(self.num_running)
        self.metrics.queued.set(self.num_waiting)

    # ---- schedule helpers ----------------------------------------------------------------------
    def _admits(self, running: list[Request]) -> bool:
        if not self.policy.sla_mode or not running:
            return True
        return self.policy.can_admit([r.id for r in running], self.slowest_speed(running))

    def slowest_speed(self, running: list[Request]) -> float | None:
        """The slowest measured per-user speed among `running` requests old enough to say (SLA
        admission closes its loop over it); None when none is."""
        now = self.clock()
        speeds = [s for r in running if r.replay_of is None and len(r.output_ids) >= SLA_MIN_TOKENS
                  and (s := r.speed(now)) is not None]  # a canary replay never drafts: not a user's speed
        return min(speeds, default=None)

    def _sampling(self, reqs: list[Request], anchor_pos: list[int]) -> SamplingBatch:
        """The requests' sampling; `anchor_pos`: where each one's next token is sampled from (minus one)."""
        return SamplingBatch.build([r.params for r in reqs], self._generator, anchor_pos)

    # ---- run -----------------------------------------------------------------------------------
    def _run_prefill(self, chunks: list[PrefillChunk]) -> PrefillResult:
        echo = [i for i, c in enumerate(chunks) if c.request.params.prompt_logprobs]
        logits = self.runner.prefill([(c.request.slot, c.start, c.tokens) for c in chunks], all_logits=bool(echo))
        chunk_logits = {}
        if echo:  # every position's logits: keep the echoing chunks', pass on each chunk's last
            ends = torch.cumsum(torch.tensor([len(c.tokens) for c in chunks]), 0)
            chunk_logits = {i: logits[int(ends[i]) - len(chunks[i].tokens) : int(ends[i])] for i in echo}
            logits = logits[ends - 1]
        result = PrefillResult(chunks, logits, chunk_logits=chunk_logits)
        done = [i for i, c in enumerate(chunks) if c.start + len(c.tokens) == c.request.num_prompt]
        if done:  # the first output token comes from the prompt's last position
            reqs = [chunks[i].request for i in done]
            batch = self._sampling(reqs, [r.num_prompt - 1 for r in reqs])
            first_logits = constrain_rows(batch.biased(logits[done]), [r.grammar for r in reqs])
            first = batch.sample(batch.probs(first_logits))
            result.first_tokens = dict(zip(done, first.tolist()))
        return result

    def _run_decode(self, reqs: list[Request], plan: DraftPlan) -> DecodeResult:
        start = self.clock()
        rows = [DecodeRow(r.slot, r.kv_len, r.tokens[r.kv_len]) for r in reqs]
        batch = self._sampling(reqs, [r.anchor_pos for r in rows])
        lens = torch.zeros(len(reqs), dtype=torch.int64)
        drafts = probs = conf = conf_logits = None
        grammars = [r.grammar for r in reqs]
        if plan.draft:
            vocab = getattr(self.runner.drafter, "draft_vocab", None)
            sampler = batch.draft_sampler(vocab)
            sampler = grammar_draft_sampler(sampler, grammars, vocab) if any(grammars) else sampler
            try:
                out = self.runner.draft(rows, sampler, self.policy.draft_block(plan))
            finally:  # a draft that raised must not leave matchers advanced (the step may be re-run)
                if any(grammars):
                    sampler.rollback()
            drafts, probs, conf_logits = out.tokens, out.probs, out.conf_logits
            conf = apply_sts(conf_logits, self.sts)
            lens = self.policy.allocate(conf, plan)
            lens[[i for i, r in enumerate(reqs) if r.no_draft]] = 0  # canary replays verify no draft
        drafted_at = self.clock()
        fwd = self.runner.verify_forward(rows, drafts, lens)
        verify_logits = constrain_ragged(fwd.logits, grammars, drafts, lens)  # fwd.logits stay raw for logprobs
        num_acc, nxt = verify_step(batch, drafts, probs, verify_logits, lens, self._generator)
        return DecodeResult(reqs, rows, plan, lens, num_acc, nxt, drafts, conf, conf_logits, fwd.logits, fwd.hidden,
                            start, drafted_at, self.clock())

    # ---- postprocess ---------------------------------------------------------------------------
    def _commit_prefill(self, result: PrefillResult) -> None:
        for i, chunk in enumerate(result.chunks):
            req = chunk.request
            m = min(len(chunk.tokens), req.num_prompt - chunk.start - 1)
            if i in result.chunk_logits and m > 0:  # row j predicts prompt token start + j + 1
                req.prompt_logprobs.extend(token_logprobs(
                    result.chunk_logits[i][:m], req.prompt_ids[chunk.start + 1 : chunk.start + 1 + m],
                    req.params.top_logprobs))
            req.kv_len += len(chunk.tokens)
            self.metrics.prompt_tokens.inc(len(chunk.tokens))
            if i in result.first_tokens:
                req.first_token_at = self.clock()
                if req.replay_of is None:
                    self.metrics.ttft.observe(req.first_token_at - req.arrival)
                token = result.first_tokens[i]
                self._commit_or_fail(req, [token], result.last_logits[i : i + 1])

    def _commit_decode(self, d: DecodeResult) -> None:
        accepted, widths = d.num_accepted.tolist(), (d.lens + 1).tolist()
        self.runner.commit(d.rows, accepted, d.hidden, widths)
        row = 0
        for i, req in enumerate(d.requests):
            n, width = accepted[i], widths[i]
            req.kv_len += n + 1
            tokens = (d.drafts[i, :n].tolist() if n else []) + [int(d.next_tokens[i])]
            if req.replay_of is None:  # replays verify no draft: they would drag the users' tau down
                self.metrics.accept_length.observe(n + 1)
            self._commit_or_fail(req, tokens, d.logits[row : row + n + 1])
            row += width
        d.end = self.clock()

    def _commit_or_fail(self, req: Request, tokens: list[int], logits: torch.Tensor) -> None:
        """`_commit`, where an error (detokenizing, stop strings, grammar, logprobs) ends only this request."""
        try:
            self._commit(req, tokens, logits)
        except Exception as exc:
            logger.exception("request %s ended: committing its tokens failed", req.id)
            self.metrics.request_faults.labels(kind=type(exc).__name__).inc()
            self.fail(req.id, f"the engine could not process this request ({type(exc).__name__}: {exc})")

    def _commit(self, req: Request, tokens: list[int], logits: torch.Tensor) -> None:
        """Emit tokens whose target logits are `logits` (one row each); finish the request when it ends."""
        if req.expected is not None and req.divergence_margin is None:
            req.divergence_margin = divergence_margin(
                tokens, logits, req.expected[len(req.output_ids):], req.params,
                end_ids=self.output.eos_ids if req.expected_eos else (),
                legal=None if req.grammar is None else req.grammar.mask)
        logprobs = token_logprobs(logits, tokens, req.params.top_logprobs) if req.params.logprobs else None
        now = self.clock()
        kept = self.output.commit(req, tokens, logprobs)
        if req.grammar is not None:  # only committed tokens advance the matcher for good
            for token in tokens[:kept]:
                req.grammar.accept(token)
        if req.replay_of is None:
            self.metrics.generation_tokens.inc(kept)
            if kept and req.id in self._last_emit:
                self.metrics.itl.observe((now - self._last_emit[req.id]) / kept)
        self._last_emit[req.id] = now
        if req.finished:
            self.scheduler.finish(req)
            self._release(req)

    def _release(self, req: Request) -> None:
        if req.replay_of is not None:
            self._release_replay(req)
            return
        self.canary.consider(req)
        tier = self.config.sla_tok_s_per_user
        speed = req.speed(self.clock()) if tier is not None and req.finish_reason != "abort" else None
        if speed is not None:
            self.metrics.sla_requests.labels(outcome="met" if speed >= tier else "missed").inc()
        self.policy.release(req.id)
        self._last_emit.pop(req.id, None)
        self.metrics.requests_finished.labels(reason=req.finish_reason or "abort").inc()
        if not self.scheduler.running:
            self.policy.on_idle()

    def _replay_request(self, replay: Replay) -> Request:
        # a constrained original is replayed under its grammar: else every replay would mismatch
        return self._constrained(Request(f"canary-{next(self._ids)}-{replay.original_id}", replay.prompt_ids,
                                         replay_params(replay.params), lambda out: None, arrival=self.clock()))

    def _release_replay(self, req: Request) -> None:
        self.policy.release(req.id)
        self._last_emit.pop(req.id, None)
        outcome = self.canary.finished(req, self.runner.target.fmt)
        if outcome is not None:
            self.metrics.canary_replays.inc()
            if outcome == NEAR_TIE:
                self.metrics.canary_near_ties.inc()
            elif outcome == MISMATCH:
                self.metrics.canary_mismatches.inc()

    # ---- offline use and introspection ---------------------------------------------------------
    def generate(self, prompts, params_list, *, request_ids=None, max_steps: int = 1_000_000,
                 progress: str | None = None) -> list[list[int]]:
        """Offline batch generation on the caller's thread: submit every prompt, step until all
        finished, return each one's output token ids (a tqdm bar when `progress` names it)."""
        outputs: dict[str, list[int]] = {}
        done: set[str] = set()
        bar = tqdm(total=len(prompts), desc=progress, unit="req") if progress else None

        def callback(out: RequestOutput) -> None:
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                done.add(out.request_id)
                if bar is not None:
                    bar.update(1)

        request_ids = request_ids or [None] * len(prompts)
        ids = [self.submit(p, sp, callback, rid) for p, sp, rid in zip(prompts, params_list, request_ids)]
        for _ in range(max_steps):
            if len(done) == len(ids):
                break
            self.step()
        if bar is not None:
            bar.close()
        if len(done) != len(ids):
            raise RuntimeError(f"{len(ids) - len(done)} requests unfinished after {max_steps} steps")
        return [outputs.get(i, []) for i in ids]

    def set_forced_budget(self, frac: float | None) -> None:
        """Fix each step's verify budget at frac * requests * gamma (the profiler's knob, SGLang's
        dspark_force_budget_frac); None hands it back to the planner."""
        self.policy.forced_budget_frac = frac

    def release_idle_memory(self) -> bool:
        """Nothing runs: the caches' pages and malloc's freed heap go back to the OS (engine/heap.py,
        kv_cache.release_on_demand); the next requests commit what they touch anew, which costs a
        page fault per 4 KiB written. False (nothing done) while a request runs or waits."""
        if not self.idle:
            return False
        self.runner.release_pages()
        release_freed_memory()
        return True

    def flush_cache(self) -> bool:
        """True when nothing runs (there is no prefix cache to drop); False while busy."""
        return self.idle

    def model_info(self) -> dict:
        """SGLang's /model_info body: what sglang-router reads when a worker registers."""
        config = self.target.config
        return {"model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": getattr(config, "model_type", None),
                "architectures": getattr(config, "architectures", None)}

    def server_info(self) -> dict:
        state = {"dspark_info_record": {
            **self.policy.describe(), "gamma": self.gamma,
            "sts_temperatures": None if self.sts is None else self.sts.tolist(),
            "records": self.records.as_dicts()}}
        accept = self.records.avg_accept_length() if self.gamma else None
        if accept is not None:  # as SGLang: only with speculation on, once a step ran (bench_serving reads it)
            state["avg_spec_accept_length"] = accept
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "engine": "reference",
            "max_running_requests": self.config.max_running,
            "context_length": self.max_len,
            "kv_cache_bytes": self.runner.kv_bytes(),
            "weight_format": self.runner.target.weight_format,  # engine/cpu/formats.py
            "threads": None if self.threads is None else {**self.threads.report(),
                                                          "decode_steps": _count(self.metrics.verify_steps)},
            "dspark_fingerprint": self.identity,
            "internal_states": [state],
        }


def _count(counter) -> int:
    return int(next(s.value for s in counter.collect()[0].samples if s.name.endswith("_total")))


def _eos_ids(tokenizer, target) -> set[int]:
    ids = getattr(target.config, "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids

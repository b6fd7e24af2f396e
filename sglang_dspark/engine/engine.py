"""The reference engine: continuous batching with DSpark speculative decoding on PyTorch.

One `step()` reads top to bottom (nano-vllm style):
  admit waiting requests into free KV slots
  prefill: one chunked forward over prompt pieces (their hidden states feed the drafter's context)
  decode:  capacity from lagged confidences -> draft a block per request -> STS -> top-K allocation
           -> ONE ragged target forward over sum(1 + l_r) tokens -> rejection sampling -> commit
  stream new text to each request's callback, record the step, update metrics

Modes: "target" (no speculation), "full" (DSpark, verify every draft), "scheduled" (DSpark with
the AsyncPlanner over the profile's SPS table; a flat table means verify-all).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from sglang_dspark.core.calibration import apply_sts
from sglang_dspark.core.schedule import AsyncPlanner
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.core.verify import verify_chain, verify_chain_greedy, verify_chain_greedy_argmax
from sglang_dspark.engine.detokenize import Detokenizer
from sglang_dspark.engine.request import Request, RequestOutput
from sglang_dspark.engine.sampling import SamplingBatch, SamplingParams
from sglang_dspark.engine.target_model import Segment, TargetModel
from sglang_dspark.metrics import EngineMetrics

logger = logging.getLogger(__name__)

MODES = ("target", "full", "scheduled")
# Verify sizes the step is snapped to: CUDA-graph buckets on a GPU, the same logic on a CPU.
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


@dataclass
class EngineConfig:
    mode: str = "scheduled"
    max_running: int = 16  # KV slots
    max_len: int = 1024  # positions per slot: prompt + output + one draft block
    prefill_chunk: int = 256  # prompt tokens per step, over all prefilling requests
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    lag: int = 2  # the planner's confidence lag in steps (SGLang's relay lag)
    seed: int = 0
    sla_tok_s_per_user: float | None = None  # SLA mode: capacity keeps every user above this speed
    probe_every: int = 16  # when drafting is not worth it, still draft every n-th step to re-measure,
    probe_max: int = 128  # doubling the interval after each probe that changes nothing, up to this
    max_records: int = 4096  # per-step records kept for /server_info

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {self.mode!r}")


class Engine:
    def __init__(
        self,
        target: TargetModel,
        tokenizer,
        drafter=None,
        *,
        config: EngineConfig | None = None,
        sps: SpsTable | None = None,
        sts_temperatures: torch.Tensor | None = None,
        model_name: str = "model",
    ):
        self.config = config = config or EngineConfig()
        if config.mode != "target" and drafter is None:
            raise ValueError(f"mode {config.mode!r} needs a drafter")
        self.target, self.tokenizer, self.model_name = target, tokenizer, model_name
        self.drafter = drafter if config.mode != "target" else None
        self.cache = target.new_kv_cache(config.max_running, config.max_len)
        self.gamma = self.drafter.gamma if self.drafter else 0
        # Usable context: each slot also holds one draft block beyond the last token.
        self.max_len = config.max_len - self.gamma - 1
        if self.drafter is not None:
            from sglang_dspark.drafter.model import DraftKVCache

            self.draft_cache = DraftKVCache(self.drafter, config.max_running, config.max_len)
            self.capture = tuple(self.drafter.config.target_layer_ids)
        else:
            self.capture = ()
        self.sps = sps or SpsTable.flat(config.max_running * (self.gamma + 1))
        self.sts = sts_temperatures
        self.planner = None
        if self.gamma:
            self.planner = AsyncPlanner(
                self.sps, self.gamma, lag=config.lag, buckets=config.buckets,
                sla_tok_s_per_user=config.sla_tok_s_per_user, prior="observed",
            )
        self.eos_ids = self._eos_ids(tokenizer, target)
        self.metrics = EngineMetrics()
        self.records: deque[dict] = deque(maxlen=config.max_records)
        self.forced_budget_frac: float | None = None  # profiler knob, as SGLang's dspark_force_budget_frac
        self._generator = torch.Generator().manual_seed(config.seed)
        self._free_slots = list(range(config.max_running))
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._detok: dict[str, Detokenizer] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._undrafted_steps = 0
        self._probe_interval = config.probe_every
        self._last_decode_end: float | None = None  # SLA mode measures the time between decode steps
        self._step_ratios: deque[float] = deque(maxlen=64)  # SLA mode: measured / predicted step time
        # Observer of every drafted round: (request_id, accepted, verified, raw conf logits [G]).
        # Offline evaluation reads acceptance and calibration data through it.
        self.on_round: Callable[[str, int, int, torch.Tensor], None] | None = None

    @staticmethod
    def _eos_ids(tokenizer, target) -> set[int]:
        ids = getattr(target.config, "eos_token_id", None)
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
        if getattr(tokenizer, "eos_token_id", None) is not None:
            ids.add(tokenizer.eos_token_id)
        return ids

    # ---- public API (thread-safe) ------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + self._inbox.qsize()

    def submit(self, prompt_ids, params: SamplingParams, callback, request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"context limit of {self.max_len} tokens"
            )
        rid = request_id or f"req-{next(self._ids)}"
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self._inbox.put(("add", Request(rid, prompt_ids, params, callback, generator)))
        return rid

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def generate(self, prompts, params_list, *, request_ids=None, max_steps: int = 1_000_000,
                 progress: str | None = None) -> list[list[int]]:
        """Offline batch generation without the engine thread: submit every prompt, step until
        all finished, return each one's output token ids (a tqdm bar when `progress` names it)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("generate() steps the engine itself; do not call it while start()ed")
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

    def flush_cache(self) -> bool:
        return self.num_running == 0 and self.num_waiting == 0  # no prefix cache: nothing else to drop

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="dspark-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout=30)

    def server_info(self) -> dict:
        return {
            "model_path": self.model_name,
            "engine": "reference",
            "max_running_requests": self.config.max_running,
            "context_length": self.max_len,
            "internal_states": [
                {
                    "dspark_info_record": {
                        "mode": self.config.mode,
                        "gamma": self.gamma,
                        "sps_table": "flat" if self.sps.is_flat else "profiled",
                        "records": list(self.records),
                    }
                }
            ],
        }

    # ---- loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox(block=not (self._running or self._waiting))
            if self._running or self._waiting:
                try:
                    self.step()
                except Exception:  # a failed step must not strand clients: fail its requests loudly
                    logger.exception("engine step failed; aborting running requests")
                    for req in list(self._running):
                        self._finish(req, "abort")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                self._waiting.append(payload)
            elif kind == "abort":
                self._abort(payload)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _abort(self, request_id: str) -> None:
        for req in list(self._waiting):
            if req.id == request_id:
                self._waiting.remove(req)
                self._emit(req, [], "abort")
        for req in list(self._running):
            if req.id == request_id:
                self._finish(req, "abort")

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> None:
        self._drain_inbox(block=False)
        while self._waiting and self._free_slots and self._sla_admits():
            req = self._waiting.popleft()
            req.slot = self._free_slots.pop()
            self._detok[req.id] = Detokenizer(self.tokenizer, req.params.stop)
            self._running.append(req)
        prefill = [r for r in self._running if r.prefilling]
        decode = [r for r in self._running if not r.prefilling]
        if prefill:
            self._prefill(prefill)
        if decode:
            self._decode(decode)
        self.metrics.running.set(len(self._running))
        self.metrics.queued.set(self.num_waiting)

    def _prefill(self, reqs: list[Request]) -> None:
        budget, segments, chosen = self.config.prefill_chunk, [], []
        for req in reqs:
            n = min(budget, req.num_prompt - req.kv_len)
            if n <= 0:
                break
            segments.append(Segment(req.slot, req.kv_len, torch.tensor(req.prompt_ids[req.kv_len : req.kv_len + n])))
            chosen.append(req)
            budget -= n
        out = self.target.forward_segments(segments, self.cache, capture_layers=self.capture, logits_for="last")
        offset, done, last_rows = 0, [], []
        for i, (req, seg) in enumerate(zip(chosen, segments)):
            n = len(seg.tokens)
            if self.drafter is not None:
                self.draft_cache.append(req.slot, torch.arange(seg.start, seg.start + n), out.hidden[offset : offset + n])
            offset += n
            req.kv_len += n
            self.metrics.prompt_tokens.inc(n)
            if not req.prefilling:
                done.append(req)
                last_rows.append(i)
        if done:  # the first output token comes from the prompt's last position
            batch = self._sampling(done)
            first = batch.sample(batch.probs(out.logits[last_rows]))
            for req, token in zip(done, first.tolist()):
                req.first_token_at = time.perf_counter()
                self.metrics.ttft.observe(req.first_token_at - req.arrival)
                self._commit(req, [token])

    def _sampling(self, reqs: list[Request]) -> SamplingBatch:
        return SamplingBatch.build([r.params for r in reqs], [r.generator for r in reqs], self._generator)

    @property
    def _sla_mode(self) -> bool:
        return self.planner is not None and self.config.sla_tok_s_per_user is not None

    def _sla_admits(self) -> bool:
        if self.planner is None or not self._running:
            return True
        return self.planner.can_admit([r.id for r in self._running], self._slowest_measured_speed())

    def _slowest_measured_speed(self, min_tokens: int = 8) -> float | None:
        """The slowest running request's speed so far, (tokens - 1) / seconds since its first token,
        the load tests' per-user speed; requests with fewer than `min_tokens` are too young to say."""
        if not self._sla_mode:
            return None
        now = time.perf_counter()
        speeds = [(len(r.output_ids) - 1) / (now - r.first_token_at) for r in self._running
                  if r.first_token_at is not None and len(r.output_ids) >= min_tokens and now > r.first_token_at]
        return min(speeds, default=None)

    def _track_overhead(self, t0: float) -> None:
        """SLA mode: EWMA of the wall time between consecutive decode steps (prefill chunks,
        streaming), which every running user waits through but no SPS table holds."""
        if not self._sla_mode:
            return
        if self._last_decode_end is not None:
            gap = t0 - self._last_decode_end
            self.planner.overhead_seconds += 0.1 * (gap - self.planner.overhead_seconds)

    def _track_time_scale(self, ratio: float) -> None:
        """SLA mode: the tier is a promise, so the planner scales the table by the 90th percentile
        of measured / predicted step time over the last 64 steps (load the profile did not see:
        neighbours on the host, longer contexts)."""
        if not self._sla_mode:
            return
        self._step_ratios.append(ratio)
        self.planner.time_scale = float(np.quantile(np.fromiter(self._step_ratios, float), 0.9))

    def _decode(self, reqs: list[Request]) -> None:
        t0 = time.perf_counter()
        self._track_overhead(t0)
        R, G = len(reqs), self.gamma
        batch = self._sampling(reqs)
        anchors = torch.tensor([r.tokens[r.kv_len] for r in reqs])
        anchor_pos = torch.tensor([r.kv_len for r in reqs])
        lens = torch.zeros(R, dtype=torch.int64)
        capacity, drafts, draft_probs, predicted = 0, None, None, None
        if self.drafter is not None:
            ids = [r.id for r in reqs]
            capacity = self._capacity(ids, R)
            if self._should_draft(capacity):
                out = self.drafter.draft(self.draft_cache, [r.slot for r in reqs], anchors, anchor_pos, sampler=batch.draft_sampler())
                drafts, draft_probs, conf_logits = out.tokens, out.probs, out.conf_logits
                conf = apply_sts(conf_logits, self.sts)
                lens = torch.full((R,), G, dtype=torch.int64) if self.config.mode == "full" else self.planner.allocate(conf, capacity)
                self.planner.observe(ids, conf)
        t_draft = time.perf_counter()

        width = int(lens.max()) if R else 0
        segments = [
            Segment(r.slot, r.kv_len, torch.cat([anchors[i : i + 1], drafts[i, : lens[i]]]) if width else anchors[i : i + 1])
            for i, r in enumerate(reqs)
        ]
        out = self.target.forward_segments(segments, self.cache, capture_layers=self.capture)
        num_acc, nxt = self._verify(batch, drafts, draft_probs, out.logits, lens, width)
        t_verify = time.perf_counter()

        row = 0
        verified, accepted = [0] * max(G, 1), [0] * max(G, 1)
        for i, req in enumerate(reqs):
            n, l = int(num_acc[i]), int(lens[i])
            if self.drafter is not None:
                self.draft_cache.append(req.slot, torch.arange(req.kv_len, req.kv_len + n + 1), out.hidden[row : row + n + 1])
            row += l + 1
            for k in range(l):
                verified[k] += 1
                accepted[k] += int(k < n)
            if self.on_round is not None and drafts is not None:
                self.on_round(req.id, n, l, conf_logits[i])
            new = (drafts[i, :n].tolist() if n else []) + [int(nxt[i])]
            req.kv_len += n + 1
            self.metrics.accept_length.observe(n + 1)
            self._commit(req, new)
        step_s = time.perf_counter() - t0
        self._last_decode_end = t0 + step_s
        num_tokens = R + int(lens.sum())
        if not self.sps.is_flat:
            predicted = 1.0 / self.sps(num_tokens, num_requests=R, drafted=drafts is not None)
            self._track_time_scale(step_s / predicted)
        self.metrics.observe_step(step_s, predicted)
        self.metrics.verify_tokens.observe(num_tokens)
        self.metrics.verify_steps.inc()
        if G:
            self.metrics.observe_positions(verified, accepted)
        self.records.append(
            {
                "bs": R,
                "budget": capacity,
                "num_verify_tokens": num_tokens,
                "accepted_drafts": int(num_acc.sum()),
                "predicted_step_ms": None if predicted is None else round(predicted * 1e3, 3),
                "step_ms": round(step_s * 1e3, 3),
                "draft_ms": round((t_draft - t0) * 1e3, 3),
                "target_verify_ms": round((t_verify - t_draft) * 1e3, 3),
                "time": time.time(),
            }
        )

    def _should_draft(self, capacity: int) -> bool:
        """Skip the drafter when the planner decided that no draft is worth verifying: the
        capacity came from lagged confidences, so skipping cannot bias the output. Every
        `probe_every`-th such step drafts anyway, to keep the confidences fresh; so does the first
        step of a scheduled engine, which has none yet (`_measuring_first`). A forced budget
        of zero (the profiler's) skips it too, so a profile measures the step the engine runs.
        Probes that keep confirming a zero budget back off (16, 32, ... up to `probe_max` steps)."""
        if self.forced_budget_frac is not None:
            return capacity > 0
        if self._measuring_first:
            return True
        decision = self.planner.last_decision
        worthless = self.config.mode == "scheduled" and decision is not None and decision.budget == 0
        if worthless and self._undrafted_steps < self._probe_interval:
            self._undrafted_steps += 1
            return False
        # A probe that follows a zero budget doubles the next interval; any other draft resets it.
        self._probe_interval = (min(2 * self._probe_interval, self.config.probe_max) if worthless
                                else self.config.probe_every)
        self._undrafted_steps = 0
        return True

    @property
    def _measuring_first(self) -> bool:
        """Scheduled mode before any confidence was seen: the first step drafts with capacity 0,
        which costs one drafter call and verifies nothing, so that every later capacity (and the
        planner's prior for new requests) rests on measured confidences rather than survival 1.
        A flat table verifies everything whatever the confidences, so it skips this."""
        return (self.config.mode == "scheduled" and self.forced_budget_frac is None
                and not self.sps.is_flat and self.planner.rows_observed == 0)

    def _capacity(self, ids: list[str], num_requests: int) -> int:
        if self.config.mode == "full":
            return num_requests * self.gamma
        if self.forced_budget_frac is not None:
            return int(self.forced_budget_frac * num_requests * self.gamma)
        if self._measuring_first:
            return 0
        return self.planner.capacity(ids)

    @staticmethod
    def _pad_rows(rows: torch.Tensor, lens: torch.Tensor, width: int) -> torch.Tensor:
        """Ragged rows [sum(1 + l_r), D] -> [R, width + 1, D]; padding rows are never read."""
        R = lens.numel()
        padded = rows.new_zeros(R, width + 1, rows.shape[-1])
        mask = torch.arange(width + 1).unsqueeze(0) <= lens.unsqueeze(1)
        padded[mask] = rows
        return padded

    def _verify(self, batch, drafts, draft_probs, ragged_logits, lens, width):
        """Verify each request's drafts against the target logits [sum(1 + l_r), V] of the step."""
        R = lens.numel()
        num_acc = torch.zeros(R, dtype=torch.int64)
        nxt = torch.zeros(R, dtype=torch.int64)
        if width == 0:  # nothing to verify (one row per request): sample the next token from it
            return num_acc, batch.sample(batch.probs(ragged_logits))
        drafts, draft_probs = drafts[:, :width], draft_probs[:, :width]
        greedy = batch.greedy
        if bool(greedy.all()):  # argmax before padding: pad [T] ids, not [T, V] logits
            argmax = self._pad_rows(ragged_logits.argmax(-1, keepdim=True), lens, width).squeeze(-1)
            return verify_chain_greedy_argmax(drafts, argmax, lens)
        logits = self._pad_rows(ragged_logits, lens, width)  # [R, width + 1, V]
        if greedy.any():
            g = greedy.nonzero().squeeze(-1)
            num_acc[g], nxt[g] = verify_chain_greedy(drafts[g], logits[g], lens[g])
        target_probs = batch.probs(logits)
        # Unseeded sampled rows share one vectorised call; a seeded row uses its own generator.
        shared = [i for i in range(R) if not greedy[i] and batch.generators[i] is None]
        groups = [(shared, self._generator)] + [([i], batch.generators[i]) for i in range(R) if not greedy[i] and batch.generators[i] is not None]
        for rows, gen in groups:
            if rows:
                idx = torch.tensor(rows)
                num_acc[idx], nxt[idx] = verify_chain(drafts[idx], draft_probs[idx], target_probs[idx], lens[idx], generator=gen)
        return num_acc, nxt

    # ---- output -------------------------------------------------------------------------------
    def _commit(self, req: Request, new_tokens: list[int]) -> None:
        """Append emitted tokens, cutting at EOS or max_tokens, and stream the settled text."""
        reason = None
        kept = []
        for token in new_tokens:
            if token in self.eos_ids and not req.params.ignore_eos:
                reason = "stop"
                break
            kept.append(token)
            if len(req.output_ids) + len(kept) >= req.params.max_tokens:
                reason = "length"
                break
        req.tokens.extend(kept)
        self.metrics.generation_tokens.inc(len(kept))
        self._emit(req, kept, reason)

    def _emit(self, req: Request, token_ids: list[int], reason: str | None) -> None:
        detok = self._detok.get(req.id)
        text = ""
        if detok is not None:
            text, hit = detok.update(req.output_ids, final=reason is not None)
            if hit:
                reason = "stop"
        finished = reason is not None
        req.callback(
            RequestOutput(req.id, token_ids, text, finished, reason, req.num_prompt, len(req.output_ids))
        )
        if finished and req in self._running:
            self._finish(req, reason, emitted=True)

    def _finish(self, req: Request, reason: str, emitted: bool = False) -> None:
        self._running.remove(req)
        self._free_slots.append(req.slot)
        if not self._running:
            self._last_decode_end = None  # idle time until the next request is nobody's wait
        self._detok.pop(req.id, None)
        if self.planner is not None:
            self.planner.release(req.id)
        req.finished, req.finish_reason = True, reason
        self.metrics.requests_finished.labels(reason=reason).inc()
        if not emitted:
            req.callback(RequestOutput(req.id, [], "", True, reason, req.num_prompt, len(req.output_ids)))

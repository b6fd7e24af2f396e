"""SGLang 0.5.23's own DSpark verify planner and step observers, run on CPU (tests only).

A `DSparkVerifyPlanner` built in static or compact verify mode (with or without an SPS table) and
the `DsparkStepObservers` whose info dumper writes the step records `/server_info` serves. Supplied
here is only what SGLang reads from its runtime at construction (`get_spec`, `get_schedule`, DP
attention, the attention-TP rank) and a model-runner stand-in holding the captured CUDA-graph token
sizes; every decision (budget, forced fraction, layout, padded graph size, the record itself) is
SGLang's. A step costs `cost(bs, graph tokens)` seconds on an injected clock: the hardware.

`sim_app(sim)` puts it behind SGLang's HTTP shape (`/server_info`, `/set_internal_state` answered
by SGLang's own handlers, `/generate`), batching concurrent requests into decode steps the way a scheduler does: a request
joins at the next step (after a prefill step, which SGLang does not time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from types import SimpleNamespace
from unittest import mock

import torch

P = "sglang.srt.speculative.dspark_components.dspark_planner"
O = "sglang.srt.speculative.dspark_components.dspark_observability"
GAMMA = 7
# Captured verify token sizes: every multiple of gamma + 1 (so verify-all lies on the diagonal) and
# some between (so a smaller budget runs a smaller graph).
CAPTURE_NUM_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)
MAX_BS = 8


def true_cost(bs: int, tokens: int) -> float:
    """Seconds per step: a fixed cost, a per-request cost and a per-verified-token cost."""
    return 0.004 + 0.0005 * bs + 0.0002 * tokens


@contextlib.contextmanager
def sglang_runtime(mode: str, sps_table_path: str | None = None):
    """What a scheduler process has published by the time the planner is built."""
    import importlib

    planner, observability = importlib.import_module(P), importlib.import_module(O)
    spec = SimpleNamespace(speculative_dspark_align_verify_tokens_to_graph_tier=False,
                           speculative_dspark_confidence_sts_path=None,
                           speculative_dspark_sps_table_path=sps_table_path)
    schedule = SimpleNamespace(disable_overlap_schedule=True, max_running_requests=MAX_BS)
    env = {"SGLANG_RAGGED_VERIFY_MODE": mode, "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}
    with mock.patch.dict(os.environ, env), mock.patch.object(planner, "get_spec", lambda: spec), \
            mock.patch.object(planner, "get_schedule", lambda: schedule), \
            mock.patch.object(planner, "is_dp_attention_enabled", lambda: False), \
            mock.patch.object(observability, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0)):
        yield


class SglangDspark:
    """One DSpark worker's planner and observers; `step(rids)` runs one decode step."""

    def __init__(self, mode: str, sps_table_path: str | None = None, cost=true_cost, seed: int = 0):
        import importlib

        self.P, self.O = importlib.import_module(P), importlib.import_module(O)
        self.mode, self.cost, self.now = mode, cost, 1000.0
        self._runtime = sglang_runtime(mode, sps_table_path)
        self._runtime.__enter__()
        pool = 64
        graph = SimpleNamespace(ragged_verify_mode=mode == "compact", capture_num_tokens=list(CAPTURE_NUM_TOKENS),
                                max_bs=MAX_BS)
        self.runner = SimpleNamespace(decode_cuda_graph_runner=graph, req_to_token_pool=SimpleNamespace(
            req_generation=torch.ones(pool, dtype=torch.int64), req_to_token=torch.zeros(pool, 1)))
        self.planner = self.P.DSparkVerifyPlanner(
            draft_model=SimpleNamespace(confidence_head=object()), gamma=GAMMA, model_runner=self.runner,
            device=torch.device("cpu"), tp_rank=0, verify_num_draft_tokens=GAMMA + 1,
            tp_sync=SimpleNamespace(sync=lambda *a, **k: None))
        self.observers = self.O.DsparkStepObservers(planner=self.planner, gamma=GAMMA,
                                                    verify_num_draft_tokens=GAMMA + 1, tp_rank=0,
                                                    device=torch.device("cpu"), simulate_acc_len=0.0)
        self.observers._info_dumper._clock = lambda: self.now  # the dumper's own injectable clock
        self.slots: dict[str, int] = {}
        self.forward_ct = 0
        self.layouts: list = []  # SGLang's RaggedVerifyLayout of every step (None in static mode)
        self.gen = torch.Generator().manual_seed(seed)
        self.refusing_ranks = 0  # DP ranks whose scheduler refuses /set_internal_state (set_state)

    def close(self) -> None:
        self._runtime.__exit__(None, None, None)

    def prefill(self, rids) -> None:
        for rid in rids:
            self.slots.setdefault(rid, len(self.slots) % self.runner.req_to_token_pool.req_generation.numel())
        self.planner.note_non_decode_step()
        self.observers.note_prefill_step()

    def step(self, rids: list[str]) -> int:
        """One decode step of `rids`; returns the verify tokens the step ran (its graph size)."""
        bs = len(rids)
        indices = torch.tensor([self.slots[r] for r in rids], dtype=torch.int64)
        prefix = torch.full((bs,), 16, dtype=torch.int64)
        confidence = torch.rand(bs, GAMMA, generator=self.gen) * 0.5 + 0.45
        budget = self.planner.compute_budget_sync(confidence=confidence, prefix_lens=prefix, req_pool_indices=indices)
        layout = self.planner.schedule_layout(req_pool_indices=indices, prefix_lens=prefix, device=torch.device("cpu"),
                                              confidence=confidence, budget=budget)
        self.layouts.append(layout)
        tokens = layout.graph_num_tokens if layout is not None else bs * (GAMMA + 1)
        self.now += self.cost(bs, tokens)  # the step runs
        self.forward_ct += 1
        verify_lens = layout.verify_lens if layout is not None else torch.full((bs,), GAMMA + 1)
        correct = (verify_lens - 1).clamp(min=0) // 2
        tier = self.P.local_verify_tier_num_tokens(bs=bs, verify_token_budget=budget,
                                                   verify_num_draft_tokens=GAMMA + 1, min_verify_len=1)
        self.observers.observe_verify_step(
            forward_ct=self.forward_ct, reqs=[SimpleNamespace(rid=r) for r in rids], bs=bs, proposal_folded=False,
            verify_ids_2d=torch.zeros(bs, GAMMA + 1, dtype=torch.int64), target_logits=None, layout=layout,
            confidence=confidence, confidence_raw=None, prefix_lens=prefix,
            draft_tokens=torch.zeros(bs, GAMMA, dtype=torch.int64), draft_block=None, sampling_info=None,
            correct_len=correct, cap_trim_lens=torch.zeros(bs, dtype=torch.int64),
            bonus=torch.zeros(bs, dtype=torch.int64), commit_lens=correct + 1, verify_token_budget=budget,
            req_pool_indices=indices, verify_tier_num_tokens=tier, dp_tier_num_tokens=None)
        return tokens

    # what SGLang's scheduler reaches on its draft worker (DSparkWorkerV2's two methods)
    def set_dspark_forced_budget_frac(self, frac) -> None:
        self.planner.set_forced_budget_frac(frac)

    def clear_info_records(self) -> None:
        self.observers.clear_info_records()

    def set_state(self, server_args: dict) -> list[bool]:
        return asyncio.run(self.set_state_async(server_args))

    async def set_state_async(self, server_args: dict) -> list[bool]:
        """`/set_internal_state` as SGLang 0.5.23 answers it: each DP rank's scheduler runs its own
        `SchedulerInternalStateController.set_internal_state` (validation, refusal, the worker
        commands), and the tokenizer manager turns their outputs into a list of bools. `refusing_ranks`
        more ranks answer as a non-DSpark scheduler does (refused)."""
        from sglang.srt.managers.io_struct import SetInternalStateReq
        from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
        from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        req = SetInternalStateReq(server_args=server_args)
        ranks = [SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.DSPARK, draft_worker=self)]
        ranks += [SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, draft_worker=None)] * self.refusing_ranks
        outputs = [SchedulerInternalStateController(rank, record_step_time=False).set_internal_state(req)
                   for rank in ranks]

        async def communicator(_):
            return outputs

        manager = SimpleNamespace(auto_create_handle_loop=lambda: None, set_internal_state_communicator=communicator)
        return await TokenizerControlMixin.set_internal_state(manager, req)

    def server_info(self) -> dict:
        return {"version": "0.5.23", "speculative_num_draft_tokens": GAMMA + 1, "max_running_requests": MAX_BS,
                "internal_states": [{"dspark_info_record": self.observers.dump_info_records()}]}


def sim_app(sim: SglangDspark):
    """SGLang's HTTP shape over `sim`; one event loop, so SGLang's objects see one thread."""
    from fastapi import FastAPI

    app = FastAPI()
    waiting: list[tuple[str, int, asyncio.Future]] = []
    active: dict[str, list] = {}
    state = {"task": None, "n": 0}

    async def run_steps() -> None:
        while waiting or active:
            if waiting:
                joined = waiting[:]
                waiting.clear()
                sim.prefill([rid for rid, _, _ in joined])
                active.update({rid: [n, fut] for rid, n, fut in joined})
            sim.step(list(active))
            for rid in list(active):
                active[rid][0] -= 1
                if active[rid][0] <= 0:
                    active.pop(rid)[1].set_result(None)
            await asyncio.sleep(0)  # let arriving requests join the next step

    @app.post("/generate")
    async def generate(body: dict):
        state["n"] += 1
        future = asyncio.get_running_loop().create_future()
        waiting.append((f"req-{state['n']}", int(body["sampling_params"]["max_new_tokens"]), future))
        if state["task"] is None or state["task"].done():
            state["task"] = asyncio.create_task(run_steps())
        await future
        return {"text": "", "meta_info": {}}

    @app.get("/server_info")
    async def server_info():
        return sim.server_info()

    @app.post("/set_internal_state")
    async def set_internal_state(body: dict):
        return await sim.set_state_async(body["server_args"])

    return app

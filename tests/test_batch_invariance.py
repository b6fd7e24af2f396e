"""A request's bits do not depend on the batch: its prompt logprobs, the logprobs of every token it
emits and the tokens themselves are bitwise the same served alone and arriving in a burst beside
other requests (prompts cut into chunks, packed prefill steps, decode and verify rows batched with
other requests' rows at other context lengths), in every weight format whose rows run the package's
row kernels, and in each mode.

On an AMX Xeon, prompt rows packed with other prompts went through GEMMs of another row count and
one padded attention call, and greedy text changed with the load; the engine now runs each prompt
chunk on its own, cut at fixed positions (engine/scheduler.py, engine/model_runner.py)."""

import pytest
import torch

from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.sampling import SamplingParams
from tests.engine_fixtures import VOCAB, tiny_engine

CHUNK = 16  # prefill_chunk: prompts below are cut into 1-4 chunks
PROMPT = [int(t) for t in torch.randint(4, VOCAB, (41,), generator=torch.Generator().manual_seed(7))]
def _prompt(n: int) -> list[int]:
    return [int(t) for t in torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(n))]


# PROMPT arrives with others, its index in each burst given: behind a 9-token prompt a budget-cut
# scheduler would cut it at 7; behind a 16-token one its last chunk (9 tokens) shares a forward
# with the 5-token prompt unless chunks run alone
BURSTS = {"cut-by-budget": ([_prompt(9), PROMPT, _prompt(30), _prompt(57)], 1),
          "shared-forward": ([_prompt(16), PROMPT, _prompt(5), _prompt(30)], 1)}
# Formats whose decode and verify rows run the package's row kernels. float32's and bfloat16's go
# through torch's GEMMs and one padded SDPA call over every request's keys, whose rounding depends on
# the batch (issue 56, open): their prompts are covered below, their decode rows are not yet invariant.
FORMATS = ["int8", "int4"]


def serve(engine, prompts: list[list[int]], params: SamplingParams) -> list[tuple]:
    """Each prompt's (tokens, token logprobs with their top 5, prompt logprobs), all submitted at once."""
    got: dict[str, list] = {}

    def callback(out):
        tokens, logprobs, prompt = got.setdefault(out.request_id, ([], [], []))
        tokens.extend(out.token_ids)
        logprobs.extend((lp.token_id, lp.logprob, lp.top) for lp in out.logprobs or ())
        prompt.extend((lp.token_id, lp.logprob) for lp in out.prompt_logprobs or ())

    ids = [engine.submit(p, params, callback) for p in prompts]
    for _ in range(10_000):
        if engine.idle:
            break
        engine.step()
    return [got[i] for i in ids]


@pytest.mark.parametrize("burst", BURSTS)
@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("mode", ["target", "full"])
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded-T0.8"])
def test_a_requests_bits_are_the_same_alone_and_in_a_burst(weight_format, mode, burst, temperature):
    """Greedy, and sampled with a seed (its numbers keyed by seed and position: engine/sampling.py)."""
    if weight_format in ("int8", "int4") and cpu_rows.ops() is None:
        pytest.skip(f"{weight_format} runs aten's kernels here, whose rows are not batch-invariant: "
                    f"{cpu_rows.status()}")
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=1234, ignore_eos=True, logprobs=True,
                            top_logprobs=5, prompt_logprobs=True)
    alone = serve(tiny_engine(mode, weight_format=weight_format, prefill_chunk=CHUNK), [PROMPT], params)[0]
    prompts, index = BURSTS[burst]
    burst = serve(tiny_engine(mode, weight_format=weight_format, prefill_chunk=CHUNK), prompts, params)[index]
    assert len(alone[0]) == 20 and len(alone[2]) == len(PROMPT) - 1
    assert alone[2] == burst[2], "prompt logprobs differ"
    assert alone[1] == burst[1], "the emitted tokens' logprobs differ"
    assert alone[0] == burst[0]


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("mode", ["full", "scheduled"])
def test_a_seeded_requests_text_is_target_onlys_whatever_was_drafted(weight_format, mode):
    """Sampled with a seed, speculation changes nothing of the text: every draft verified, or half
    of them (a forced budget), in a burst, the request emits target-only's very tokens and logprobs
    alone (verification compares drafts with the target's own keyed sample: engine/verification.py)."""
    if cpu_rows.ops() is None:
        pytest.skip(f"{weight_format} runs aten's kernels here, whose rows are not batch-invariant: {cpu_rows.status()}")
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=99, ignore_eos=True, logprobs=True, top_logprobs=5)
    alone = serve(tiny_engine("target", weight_format=weight_format, prefill_chunk=CHUNK), [PROMPT], params)[0]
    engine = tiny_engine(mode, weight_format=weight_format, prefill_chunk=CHUNK)
    if mode == "scheduled":
        engine.policy.forced_budget_frac = 0.5
    prompts, index = BURSTS["shared-forward"]
    burst = serve(engine, prompts, params)[index]
    assert sum(r.accepted_drafts for r in engine.records) > 0  # drafts were verified, and some survived
    assert alone[1] == burst[1], "the emitted tokens' logprobs differ"
    assert alone[0] == burst[0]


def rounds_by_row_count(linear, x):
    """A Linear whose result moves by a few ulps with its row count: what oneDNN's bfloat16
    GEMM does on an AMX Xeon (another blocking for another row count), on any CPU."""
    y = ROW_PATH(linear, x)
    up = torch.full_like(y, float("inf"))
    for _ in range(x.shape[0] % 7):
        y = torch.nextafter(y, up)
    return y


ROW_PATH = None


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("mode", ["target", "full"])
def test_the_bursts_batch_decode_and_verify_rows_with_other_row_counts(weight_format, mode, monkeypatch):
    """The burst test's power: with decode and verify rows through a Linear that rounds by its row
    count (a reduction whose order depends on the batch), the request's bits differ alone and in the
    burst, so the equality above is about the kernels, not a burst that never batched the rows."""
    if cpu_rows.ops() is None:
        pytest.skip(f"row kernels unavailable: {cpu_rows.status()}")
    global ROW_PATH
    from sglang_dspark.engine import target_model

    ROW_PATH = target_model.call
    monkeypatch.setattr(target_model, "call", rounds_by_row_count)
    with pytest.raises(AssertionError):
        test_a_requests_bits_are_the_same_alone_and_in_a_burst(weight_format, mode, "shared-forward", 0.0)


@pytest.mark.parametrize("burst", BURSTS)
@pytest.mark.parametrize("weight_format", ["float32", "bfloat16", "int8", "int4"])
def test_a_prompts_bits_hold_in_a_burst_even_where_gemms_round_by_row_count(weight_format, burst, monkeypatch):
    """Every prompt chunk runs alone, cut at fixed positions, so what a GEMM does with the row count
    cannot reach a request's bits through what arrives beside it: its prompt logprobs and its first
    token's are the same alone and in a burst, in every weight format."""
    global ROW_PATH
    from sglang_dspark.engine import target_model

    ROW_PATH = target_model.prompt_call
    monkeypatch.setattr(target_model, "prompt_call", rounds_by_row_count)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=5,
                            prompt_logprobs=True)
    alone = serve(tiny_engine("target", weight_format=weight_format, prefill_chunk=CHUNK), [PROMPT], params)[0]
    prompts, index = BURSTS[burst]
    burst = serve(tiny_engine("target", weight_format=weight_format, prefill_chunk=CHUNK), prompts, params)[index]
    assert len(alone[2]) == len(PROMPT) - 1
    assert alone[2] == burst[2] and alone[1] == burst[1]

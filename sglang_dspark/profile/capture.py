"""In-process SPS(B) capture against the reference engine.

For each batch size R, R long requests are prefilled, then decode steps run with a forced verify
budget b (the profiler knob SGLang calls dspark_force_budget_frac), so every probe measures a whole
decode step (draft + ragged verify + commit) at batch tokens B = R + b; budget 0 skips the drafter,
as the engine does when its planner budgets nothing. Every probe starts from freshly prefilled
requests (constant context length). Probes are visited in `rounds` passes, each in a new random
order, and a probe's samples pool over the passes: a shared host's speed drifts over seconds, and
steps taken back to back would share one bias.
"""

from __future__ import annotations

import random
import statistics

from sglang_dspark.engine.sampling import SamplingParams


def budget_grid(num_requests: int, gamma: int, points: int) -> list[int]:
    """Budgets 0..R*G: every value while few, else `points` spread evenly (ends included)."""
    top = num_requests * gamma
    if top + 1 <= points:
        return list(range(top + 1))
    return sorted({round(i * top / (points - 1)) for i in range(points)})


def _start_requests(engine, prompt_ids: list[int], count: int, max_tokens: int, max_steps: int = 10_000,
                    temperature: float = 0.0) -> None:
    """Submit `count` requests and step until each has its first token (its prefill is done)."""
    started: set[str] = set()
    for i in range(count):
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True,
                                seed=i if temperature > 0 else None)
        engine.submit(prompt_ids, params, lambda out: started.add(out.request_id))
    for _ in range(max_steps):
        if len(started) == count:
            return
        engine.step()
    raise RuntimeError(f"{count - len(started)} probe requests did not finish their prefill in {max_steps} steps")


def capture(engine, prompt_ids: list[int], *, requests: list[int], points: int = 9, warmup: int = 2,
            repeats: int = 7, rounds: int = 1, seed: int = 0, temperature: float = 0.0,
            progress=None) -> dict[tuple[int, int], list[float]]:
    """Step times (ms) per (R, B) probe. `engine` is an `Engine` in scheduled mode, not started.

    The probe requests decode at `temperature`: greedy (0) by default, whose drafts go through the
    greedy chain; seeded sampled requests draft position by position and price a drafted step higher
    (the online learner corrects a table for the traffic it serves)."""
    gamma = engine.gamma
    grid = [(r, b) for r in requests for b in budget_grid(r, gamma, points)]
    rng = random.Random(seed)
    order = []
    for _ in range(rounds):
        shuffled = list(grid)
        rng.shuffle(shuffled)
        order += shuffled
    max_tokens = min(engine.max_len - len(prompt_ids), 4 * (warmup + repeats) * (gamma + 1))
    samples: dict[tuple[int, int], list[float]] = {}
    try:
        for num_requests, budget in order:
            engine.abort_all()  # fresh requests per probe: every probe sees the same short context
            engine.set_forced_budget(None)
            _start_requests(engine, prompt_ids, num_requests, max_tokens, temperature=temperature)
            engine.set_forced_budget(min(1.0, (budget + 0.5) / (num_requests * gamma)))
            for _ in range(warmup):
                engine.step()
            first = engine.records.total
            for _ in range(repeats):
                engine.step()
            records = engine.records.since(first)
            # top-K can find fewer candidates than the budget: keep the B the probe mostly ran at
            tokens = statistics.median_low([r.num_verify_tokens for r in records])
            samples.setdefault((num_requests, tokens), []).extend(
                r.step_ms for r in records if r.num_verify_tokens == tokens)
            if progress is not None:
                progress.update(1)
    finally:
        engine.set_forced_budget(None)
        engine.abort_all()
    return samples

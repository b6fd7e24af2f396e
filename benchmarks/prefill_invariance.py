"""Does a prompt's prefill depend on what is prefilled beside it? int4 on the served SmolLM2, its prompt
rows each of three ways (benchmarks/prefill_ways.py: the engine's one call per chunk, 256-row calls,
the int4 kernel).

Each prompt (one to six held-out chat prompts back to back) is prefilled twice through the engine's model runner: alone (its own
chunks of up to 256 tokens, one request per forward) and packed as the scheduler packs a burst of
arrivals (256 prompt tokens a forward over all prompts in turn, so a prompt shares forwards and is
cut where the budget runs out). Per way, the prompts whose last-position logits come out bit for bit
equal both times, whose argmax agrees, and the largest logit difference. Rows packed with other
requests also share one masked attention call per layer (engine/target_model.py), which rounds
apart from a request's own; the `kernel` way isolates that part (its Linear rows are per-row).
Then what a user (and the canary, which replays a request alone) sees: per way, the prompts whose
greedy output (`--max-tokens`, no speculation) served all at once (prefills packed, decodes
batched) equals each served alone; and what each way costs: the median time of a prompt's own
prefill, for prompts of one chat prompt (at most 64 tokens) and of more than one chunk.

    python benchmarks/prefill_invariance.py [--prompts 16] [--max-tokens 48] [--threads 2]

Prints a table and writes benchmarks/results/prefill_invariance.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from common import ROOT, heldout_prompts, load_pair, write_result
from prefill_ways import WAYS, prefill_way

from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.cpu.quantized_linear import Int4Linear
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.profile.fingerprint import hardware_id

CHUNK = 256


def alone(runner, prompts: list[list[int]]) -> tuple[list[torch.Tensor], list[float]]:
    """Each prompt's last logits, prefilled on its own, and the seconds that took (its TTFT's prefill)."""
    out, seconds = [], []
    for slot, ids in enumerate(prompts):
        start_s = time.perf_counter()
        for start in range(0, len(ids), CHUNK):
            logits = runner.prefill([(slot, start, ids[start:start + CHUNK])])
        seconds.append(time.perf_counter() - start_s)
        out.append(logits[0])
    return out, seconds


def median_ms(seconds: list[float]) -> float | None:
    return round(statistics.median(seconds) * 1e3, 1) if seconds else None


def packed(runner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """CHUNK tokens a forward, prompts in arrival order, each forward taking what the budget leaves."""
    done, pos, out = 0, [0] * len(prompts), [None] * len(prompts)
    while done < len(prompts):
        budget, chunks = CHUNK, []
        for slot, ids in enumerate(prompts):
            if budget and pos[slot] < len(ids):
                n = min(budget, len(ids) - pos[slot])
                chunks.append((slot, pos[slot], ids[pos[slot]:pos[slot] + n]))
                pos[slot] += n
                budget -= n
        logits = runner.prefill(chunks)
        for row, (slot, start, tokens) in enumerate(chunks):
            if start + len(tokens) == len(prompts[slot]):
                out[slot], done = logits[row], done + 1
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--prompts", type=int, default=16, help="held-out chat prompts")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per prompt in the served comparison")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/prefill_invariance.json"), help="JSON output path")
    args = p.parse_args()
    if args.prompts < 2 or args.max_tokens < 1:
        p.error("--prompts must be >= 2 (packing needs company) and --max-tokens >= 1")
    torch.set_num_threads(args.threads)
    target, tokenizer, _ = load_pair(args.model, None, "int4")
    # lengths from one chat prompt to six back to back (about 40-280 tokens: some take two chunks alone)
    pool = heldout_prompts(tokenizer, 6 * args.prompts)
    prompts = [sum(pool[6 * i: 6 * i + i % 6 + 1], []) for i in range(args.prompts)]
    max_len = max(map(len, prompts)) + args.max_tokens + 8
    engine = Engine(target, tokenizer, None, model_name="prefill-invariance",
                    config=EngineConfig(mode="target", max_running=len(prompts), max_len=max_len))
    single = Engine(target, tokenizer, None, model_name="prefill-invariance-alone",
                    config=EngineConfig(mode="target", max_running=1, max_len=max_len))
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    layers = [m for m in target.modules() if isinstance(m, Int4Linear)]
    results = []
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
    print(f"{'way':>9} {'logits bit-equal':>17} {'argmax equal':>13} {'max |logit diff|':>17} {'served output equal':>20} "
          f"{'prefill ms, <= 64 tokens':>25} {f'> {CHUNK} tokens':>12}")
    with torch.no_grad():
        for mode in WAYS:
            with prefill_way(layers, mode):
                alone(engine.runner, prompts[:2])  # warm this way up
                (a, seconds), b = alone(engine.runner, prompts), packed(engine.runner, prompts)
                short = median_ms([s for s, ids in zip(seconds, prompts) if len(ids) <= 64])
                long = median_ms([s for s, ids in zip(seconds, prompts) if len(ids) > CHUNK])
                equal = sum(torch.equal(x, y) for x, y in zip(a, b))
                argmax = sum(int(x.argmax()) == int(y.argmax()) for x, y in zip(a, b))
                diff = max((x - y).abs().max().item() for x, y in zip(a, b))
                together = engine.generate(prompts, [greedy] * len(prompts), max_steps=100_000)
                served = sum(single.generate([ids], [greedy], max_steps=100_000)[0] == out
                             for ids, out in zip(prompts, together))
                results.append({"way": mode, "bit_equal": equal, "argmax_equal": argmax, "max_abs_logit_diff": diff,
                                "served_equal": served, "prefill_ms_short": short, "prefill_ms_over_one_chunk": long})
                print(f"{mode:>9} {equal:>10} / {len(prompts):<3} {argmax:>8} / {len(prompts):<3} {diff:>17.4f} "
                      f"{served:>13} / {len(prompts):<3} {short if short is not None else '-':>10} "
                      f"{long if long is not None else '-':>10}")
    write_result(args.out, {"benchmark": "prefill_invariance", "host": hardware_id(), "threads": args.threads,
                            "prompts": len(prompts), "max_tokens": args.max_tokens, "prompt_tokens": [len(x) for x in prompts],
                            "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

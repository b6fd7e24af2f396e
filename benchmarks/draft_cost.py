"""What a draft costs, part by part, beside the target step it must pay for.

    python benchmarks/draft_cost.py [--requests 1,4] [--context 300] [--repeats 40] [--temperature 0]
        [--shapes shipped,g2,g3,g4,l2] [--hot-vocab 4096]

One simulated decode step per request set, as the engine makes it: the previous step's committed
row is staged into the drafter's context (`stage`), the draft projects it (`flush`: fc, norm, each
layer's K/V), then the block runs (`layers`: embedding, every layer, the final norm), the head over
the hot vocabulary (`lm_head`), the Markov chain (`markov`: the greedy chain in one kernel at T = 0,
the per-position bias and sample at T > 0) and the confidence head (`confidence`). The same step's
whole `draft()` call is timed uninstrumented beside it; `python and glue` is that call less its
instrumented parts (the probes add about a microsecond a call, so it is a lower bound). Inside the
parts, every kernel call is timed too (GEMMs by name, attention, norms, RoPE and cache writes).

Beside them, in the same repeats: the target's forward over 1, 2 and 4 rows per request (the
undrafted step's forward, and verifying 1 or 3 drafts), so each part reads as a share of T0.

Shapes: `shipped` is the drafter in --draft; the others are the same drafter with its shape changed
and random weights (a shape's cost does not depend on its weights): `gN` block size N, `lN` N layers,
`vS` a hot vocabulary of S tokens, `gated` / `rnn` the Markov head type; combine with `-`
(`g3-l2-v2048`). Arms are interleaved call by call; medians over the repeats. Prints a table and
writes benchmarks/results/draft_cost.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time
from collections import defaultdict

import torch

from common import add_common_args, balanced_order, force_drafts_per_request, heldout_prompts, load_pair, write_result


class Probe:
    """Times every call of `fn` into `sink[name]` (seconds)."""

    def __init__(self, fn, name: str, sink: dict):
        self.fn, self.name, self.sink = fn, name, sink

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.sink[self.name] += time.perf_counter() - t0
        return out

    def __getattr__(self, attr):  # a probed Linear keeps its attributes
        return getattr(self.fn, attr)


class ProbedOps:
    """The row kernels' ops, each call timed under its own name."""

    def __init__(self, ops, sink: dict):
        self._ops, self._sink = ops, sink

    def __getattr__(self, name):
        return Probe(getattr(self._ops, name), name, self._sink)


def shape_config(config, shape: str):
    """The drafter config with `shape`'s changes (see the module docstring), and its hot vocabulary size
    (None: keep the shipped one)."""
    changes, vocab = {}, None
    for part in shape.split("-"):
        if part == "shipped":
            continue
        if part in ("vanilla", "gated", "rnn"):
            changes["markov_head_type"] = part
        elif part[0] in "glv" and part[1:].isdigit():
            value = int(part[1:])
            if part[0] == "g":
                changes["block_size"] = value
            elif part[0] == "l":
                changes["num_hidden_layers"] = value
            else:
                vocab = value
        else:
            raise SystemExit(f"--shapes: {part!r} is not shipped, gN, lN, vS, vanilla, gated or rnn")
    return dataclasses.replace(config, **changes), vocab


def build_shape(shipped, target, shape: str, fmt):
    """A drafter of `shape` prepared as the engine prepares the shipped one (row kernels where they fit)."""
    from sglang_dspark.drafter import DSparkDrafter

    if shape == "shipped":
        return shipped
    config, vocab = shape_config(shipped.config, shape)
    torch.manual_seed(0)
    drafter = DSparkDrafter(config, target.embed_tokens, target.lm_head_weight()).to(shipped.dtype).eval()
    for p in drafter.parameters():  # a trained Markov W2 is not zero: let its bias be as costly as one
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else None
    hot = shipped.draft_vocab
    if vocab is not None:
        hot = torch.arange(vocab) if hot is None or vocab > hot.numel() else hot[:vocab]
    drafter.set_draft_vocab(hot)
    fmt.prepare_drafter(drafter)
    return drafter


def instrument(drafter, sink: dict):
    """Probe the drafter's row-kernel backend: its passes and every kernel and Linear inside them.
    Returns a function that removes the probes."""
    rows = drafter.rows
    if rows is None:
        raise SystemExit("this drafter does not run on the row kernels here (int8 / int4 only): nothing to probe")
    saved = {"ops": rows.ops, "fc": rows.fc, "lm_head": rows.lm_head, "layers": [(l.kv, l.rows) for l in rows.layers]}
    rows.ops = ProbedOps(rows.ops, sink)
    rows.fc, rows.lm_head = Probe(rows.fc, "gemm fc", sink), Probe(rows.lm_head, "gemm lm_head", sink)
    for layer in rows.layers:
        layer.kv = Probe(layer.kv, "gemm ctx k/v", sink)
        layer.rows = dataclasses.replace(layer.rows, **{f: Probe(getattr(layer.rows, f), f"gemm {f}", sink)
                                                        for f in ("qkv", "o", "gate_up", "down")})
    parts = {"store_context": "flush", "block_hidden": "layers", "logits": "lm_head part",
             "greedy_chain": "markov", "markov_bias": "markov", "confidence": "confidence"}
    for method, part in parts.items():
        setattr(rows, method, Probe(getattr(rows, method), "part " + part, sink))

    def remove():
        for method in parts:
            delattr(rows, method)
        rows.ops, rows.fc, rows.lm_head = saved["ops"], saved["fc"], saved["lm_head"]
        for layer, (kv, w) in zip(rows.layers, saved["layers"]):
            layer.kv, layer.rows = kv, w

    return remove


class Stepper:
    """R requests with `context` positions each, advanced one committed position per simulated step."""

    def __init__(self, target, drafter, prompts, context: int, steps: int):
        from sglang_dspark.engine.model_runner import DecodeRow, ModelRunner

        self.DecodeRow = DecodeRow
        self.r = len(prompts)
        self.runner = ModelRunner(target, drafter, self.r, context + steps + 4 * drafter.gamma + 16)
        for slot, ids in enumerate(prompts):
            ids = (ids * (context // len(ids) + 1))[:context]
            for start in range(0, context, 256):
                self.runner.prefill([(slot, start, ids[start:start + 256])])
        self.pos = context
        self.anchor = torch.tensor(prompts[0][-1])
        self.hidden = None

    def rows(self):
        return [self.DecodeRow(s, self.pos, int(self.anchor)) for s in range(self.r)]

    def verify(self, extra: int):
        """The target's forward over each request's anchor and `extra` more rows (their K/V lands past the
        committed length, as rejected drafts' do)."""
        drafts = torch.full((self.r, max(extra, 1)), int(self.anchor))
        return self.runner.verify_forward(self.rows(), drafts if extra else None,
                                          torch.full((self.r,), extra, dtype=torch.int64))

    def commit(self) -> float:
        """Stage this step's anchor rows into the drafter's context and move every request on by one;
        the seconds staging took (the forward that made the rows is not counted)."""
        out = self.verify(0) if self.hidden is None else self.hidden
        t0 = time.perf_counter()
        self.runner.commit(self.rows(), [0] * self.r, out.hidden, [1] * self.r)
        staged = time.perf_counter() - t0
        self.pos += 1
        self.hidden = None
        return staged

    def draft(self, sampler, block=None):
        return self.runner.draft(self.rows(), sampler, block)


def samplers(temperature: float, r: int):
    from sglang_dspark.engine.sampling import SamplingBatch, SamplingParams

    params = [SamplingParams(temperature=temperature, max_tokens=8) for _ in range(r)]
    return SamplingBatch.build(params, torch.Generator().manual_seed(0))


def measure(target, drafter, prompts, args, temperature: float) -> dict:
    """Per-part medians (ms) of one shape at one request count."""
    stepper = Stepper(target, drafter, prompts, args.context, 3 * (args.repeats + args.warmup) + 8)
    batch = samplers(temperature, len(prompts))
    vocab = drafter.draft_vocab
    samples = defaultdict(list)
    for i in range(args.warmup + args.repeats):
        keep = i >= args.warmup
        # the instrumented draft: every part and kernel probed
        sink = defaultdict(float)
        sink["part stage"] += stepper.commit()
        remove = instrument(drafter, sink)
        try:
            t0 = time.perf_counter()
            stepper.runner.draft_cache.flush()  # what draft() flushes first, timed on its own
            stepper.draft(batch.draft_sampler(vocab), args.block)
            sink["probed draft"] += time.perf_counter() - t0
        finally:
            remove()
        # the same step's draft, uninstrumented
        stepper.commit()
        t0 = time.perf_counter()
        stepper.draft(batch.draft_sampler(vocab), args.block)
        whole = time.perf_counter() - t0
        # the target's forward over 1, 2 and 4 rows a request
        verify = {}
        for extra in (0, 1, 3):
            t0 = time.perf_counter()
            out = stepper.verify(extra)
            verify[extra] = time.perf_counter() - t0
            if extra == 0:
                stepper.hidden = out
        stepper.commit()
        if keep:
            for k, v in sink.items():
                samples[k].append(v * 1e3)
            samples["draft call"].append(whole * 1e3)
            for extra, v in verify.items():
                samples[f"target forward, {1 + extra} rows a request"].append(v * 1e3)
    med = {k: statistics.median(v) for k, v in samples.items()}
    parts = [k for k in med if k.startswith("part ") and k != "part stage"]
    med["python and glue"] = med["draft call"] - sum(med[k] for k in parts)
    layer_kernels = [k for k in med if not k.startswith(("part ", "target ", "draft call", "probed", "python"))]
    med["kernels, all"] = sum(med[k] for k in layer_kernels)
    return med


def engine_steps(target, tokenizer, drafter, prompts, args) -> dict:
    """Whole engine steps as the StepRecords time them (step, draft, target verify) of a target-only
    engine and of a DSpark engine whose budget is forced to 0, 1 and 3 drafts a request, one step of
    each in turn: {arm: {field: median ms}}."""
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    r, gamma = len(prompts), drafter.gamma
    steps = args.repeats + args.warmup
    max_len = args.context + 4 * steps + 2 * gamma + 64
    params = [SamplingParams(max_tokens=4 * steps + 16, temperature=args.temperature, ignore_eos=True, seed=i)
              for i in range(r)]
    ids = [(p * (args.context // len(p) + 1))[:args.context] for p in prompts]
    engines = {"target-only": Engine(target, tokenizer, config=EngineConfig(mode="target", max_running=r, max_len=max_len)),
               "dspark": Engine(target, tokenizer, drafter, config=EngineConfig(max_running=r, max_len=max_len,
                                                                               learn_sps=False))}
    for engine in engines.values():
        started = []
        for i in range(r):
            engine.submit(ids[i], params[i], lambda out: started.append(out.request_id) if out.token_ids else None)
        for _ in range(10 * args.context):  # prompts in, first tokens out
            if len(set(started)) == r:
                break
            engine.step()
    arms = {"target-only": ("target-only", None), "budget 0": ("dspark", 0),
            "1 draft a request": ("dspark", 1), "3 drafts a request": ("dspark", 3)}
    samples = {a: defaultdict(list) for a in arms}
    for i in range(steps):
        for arm in balanced_order(list(arms), i):
            name, k = arms[arm]
            engine = engines[name]
            if k is not None:
                force_drafts_per_request(engine, k, r)
            before = engine.records.total
            engine.step()
            rec = engine.records.since(before)
            if i >= args.warmup and rec:
                for field in ("step_ms", "draft_ms", "target_verify_ms"):
                    samples[arm][field].append(getattr(rec[-1], field))
                samples[arm]["verified rows"].append(rec[-1].num_verify_tokens)
    out = {}
    for arm, fields in samples.items():
        med = {f: statistics.median(v) for f, v in fields.items()}
        med["rest_ms"] = med["step_ms"] - med["draft_ms"] - med["target_verify_ms"]
        out[arm] = med
    t0 = out["target-only"]["step_ms"]
    for med in out.values():
        med["of_target_only_step"] = med["step_ms"] / t0
    return out


ORDER = ["part stage", "part flush", "part layers", "part lm_head part", "part markov", "part confidence",
         "python and glue", "draft call"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "draft_cost")
    p.set_defaults(dtype="int4")
    p.add_argument("--requests", default="1,4", help="request counts R, comma-separated (default: %(default)s)")
    p.add_argument("--context", type=int, default=300, help="context positions per request (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=40, help="timed steps per shape and R (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the requests' temperature: 0 drafts by the greedy chain, > 0 by the per-position loop "
                        "(default: %(default)s)")
    p.add_argument("--shapes", default="shipped", help="drafter shapes, comma-separated: shipped, gN (block size), "
                   "lN (layers), vS (hot vocabulary), gated / rnn, joined by '-' (default: %(default)s)")
    p.add_argument("--block", type=int, default=None,
                   help="draft blocks cut to this many positions, as a step whose budget is that many drafts a "
                        "request drafts them (default: the whole block; the engine steps cut as the engine does)")
    p.add_argument("--no-engine-steps", dest="engine_steps", action="store_false",
                   help="skip the whole engine steps (target-only, and budgets of 0, 1 and 3 drafts a request)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer, shipped = load_pair(args.model, args.draft, args.dtype)
    fmt = target.fmt  # the format the engine prepared the shipped drafter in
    request_counts = [int(x) for x in args.requests.split(",")]
    shapes = args.shapes.split(",")
    prompts = heldout_prompts(tokenizer, max(request_counts))
    results = {}
    with torch.inference_mode():
        for shape in shapes:
            drafter = build_shape(shipped, target, shape, fmt)
            cfg = drafter.config
            desc = (f"gamma {cfg.block_size}, {cfg.num_hidden_layers} layer(s), hot vocabulary "
                    f"{'all' if drafter.draft_vocab is None else drafter.draft_vocab.numel()}, {cfg.markov_head_type} Markov")
            for r in request_counts:
                med = measure(target, drafter, prompts[:r], args, args.temperature)
                results[f"{shape} R={r}"] = {"shape": shape, "describe": desc, "requests": r, "block": args.block, "ms": med}
                t0 = med["target forward, 1 rows a request"]
                print(f"\n{shape} ({desc}{'' if args.block is None else f', blocks cut to {args.block}'}), R = {r}, "
                      f"context {args.context}, T = {args.temperature}: "
                      f"target forward T0 {t0:.3f} ms")
                print(f"| part | ms | of T0 |\n|---|---|---|")
                for k in ORDER:
                    print(f"| {k.removeprefix('part ')} | {med[k]:.3f} | {med[k] / t0:.3f} |")
                for extra in (1, 3):
                    v = med[f"target forward, {1 + extra} rows a request"]
                    print(f"| target forward, 1 + {extra} rows | {v:.3f} | {v / t0:.3f} |")
                kernels = sorted((k for k in med if not k.startswith(("part ", "target ", "draft call", "probed", "python", "kernels"))),
                                 key=lambda k: -med[k])
                print("kernels inside the parts: " + ", ".join(f"{k} {med[k]:.3f}" for k in kernels))
                if args.engine_steps:
                    steps = engine_steps(target, tokenizer, drafter, prompts[:r], args)
                    results[f"{shape} R={r}"]["engine_steps_ms"] = steps
                    print(f"whole engine steps, R = {r} (medians, ms): \n| arm | step | draft | target verify | rest "
                          f"| verified rows | step / target-only |\n|---|---|---|---|---|---|---|")
                    for arm, m in steps.items():
                        print(f"| {arm} | {m['step_ms']:.3f} | {m['draft_ms']:.3f} | {m['target_verify_ms']:.3f} | "
                              f"{m['rest_ms']:.3f} | {m['verified rows']:.0f} | {m['of_target_only_step']:.3f} |")
    write_result(args.out, {"host": platform.processor() or platform.machine(), "load_avg": os.getloadavg(),
                            "dtype": args.dtype, "context": args.context, "repeats": args.repeats,
                            "temperature": args.temperature, "threads": args.threads, "results": results})


if __name__ == "__main__":
    main()

"""What the engine benchmarks share: their common flags, the model pair, the held-out prompts, and
one run of a request set through the engine on its thread."""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_dspark.engine.cpu.names import FORMAT_CHOICES as DTYPES  # torch-free, for --help

ROOT = Path(__file__).resolve().parents[1]


def add_common_args(parser, result_name: str) -> None:
    """--model, --draft, --profile, --dtype, --threads and --out (benchmarks/results/<result_name>.json)."""
    parser.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    parser.add_argument("--draft", default=str(ROOT / "launch/models/smollm2-135m-instruct-dspark"), help="drafter directory")
    parser.add_argument("--profile", default=str(ROOT / "sla_profiles/smollm2-135m-instruct-cpu.yaml"),
                        help="SLA profile whose SPS table drives the scheduled mode")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="weight format of both models (engine/cpu/formats.py), as launch --dtype")
    parser.add_argument("--out", default=str(ROOT / f"benchmarks/results/{result_name}.json"), help="JSON output path")


def balanced_order(arms, repeat: int) -> list:
    """The order of `arms` in repeat number `repeat` (0-based): a Williams design, where over
    len(arms) repeats (2 x len(arms) when odd) every arm runs right after every other arm equally
    often. A plain rotation keeps the cyclic order, so one arm would always follow the heaviest one
    (verify-all) and carry whatever that leaves behind on a shared host into every repeat."""
    n = len(arms)
    first = [0]
    for i in range(1, n):  # 0, 1, n-1, 2, n-2, ...
        first.append((i + 1) // 2 if i % 2 else n - i // 2)
    rows = [[(a + r) % n for a in first] for r in range(n)]
    if n % 2:  # odd: each row and its reverse
        rows += [row[::-1] for row in rows]
    return [arms[i] for i in rows[repeat % len(rows)]]


def force_drafts_per_request(engine, k: int, max_requests: int) -> None:
    """Fix `engine`'s verify budget at k drafts a request for any batch of up to `max_requests`: the
    forced fraction's capacity is int(frac * R * gamma), so k / gamma alone can round down to k * R - 1."""
    gamma = engine.gamma
    engine.set_forced_budget(k / gamma + 0.5 / (max_requests * gamma))


def heldout_prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` chat-templated prompt ids, cycling through the built-in held-out split."""
    from sglang_dspark.prompts import load_prompts
    from sglang_dspark.prompts import chat_ids

    records = load_prompts("builtin:heldout")
    return [chat_ids(tokenizer, records[i % len(records)].prompt) for i in range(count)]


def load_pair(model: str, draft: str, weight_format: str = "auto"):
    """(TargetModel, tokenizer, drafter) for a target directory or zoo name and a drafter directory
    in `weight_format`: the engine factory's loader, so benchmarks run exactly what the server runs
    (the format chosen is `target.weight_format`); `int4+aten` / `int8+aten`: without the CPU row kernels."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sglang_dspark import zoo
    from sglang_dspark.engine.factory import load_models

    fmt, row_kernels = format_and_kernels(weight_format)
    return load_models(zoo.resolve_model(model), draft, weight_format=fmt, row_kernels=row_kernels)


@dataclass
class Run:
    wall_s: float  # first submit to last finish
    arrivals: dict[str, list[tuple[float, int]]]  # per request: (seconds after start, tokens) of each output
    completion_tokens: int
    records: list  # the engine's StepRecords of the run

    def user_speeds(self) -> list[float]:
        """Per-user speed, the load tests' definition: (n_out - 1) / (t_last - t_first)."""
        out = []
        for events in self.arrivals.values():
            n_out, span = sum(n for _, n in events), events[-1][0] - events[0][0]
            if n_out > 1 and span > 0:
                out.append((n_out - 1) / span)
        return out

    def ttfts(self) -> list[float]:
        return [events[0][0] for events in self.arrivals.values()]


def serve_all(engine, prompts: list[list[int]], params, timeout_s: float = 3600) -> Run:
    """Submit every prompt at once to `engine` (an Engine) and step it on this thread until all
    finish. This thread loaded the models: torch work on any other thread would run 1.45x slower on
    a 2-core Intel Xeon (sglang_dspark/engine/async_engine.py, AsyncEngine.built_on_its_thread,
    is how the server keeps to one thread)."""
    arrivals: dict[str, list[tuple[float, int]]] = {}
    state = {"left": len(prompts), "tokens": 0}
    first = engine.records.total

    def callback(out):
        now = time.perf_counter() - start
        if out.token_ids:
            arrivals.setdefault(out.request_id, []).append((now, len(out.token_ids)))
        if out.finished:
            state["tokens"] += out.completion_tokens
            state["left"] -= 1

    start = time.perf_counter()
    for ids in prompts:
        engine.submit(ids, params, callback)
    while state["left"] and time.perf_counter() - start < timeout_s:
        engine.step()
    if state["left"]:
        raise RuntimeError(f"{state['left']} requests unfinished after {timeout_s} s")
    wall = time.perf_counter() - start
    return Run(wall, arrivals, state["tokens"], engine.records.since(first))


def time_calls(spent: dict, methods) -> None:
    """Wrap each (owner, attribute name, label) of `methods` (an object's method, or a module's
    function) so that its calls add their wall seconds to spent[label]; nested parts count in both."""
    for owner, name, label in methods:
        def wrapped(*args, _f=getattr(owner, name), _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - t0
        setattr(owner, name, functools.wraps(getattr(owner, name))(wrapped))


def timed(fns: dict, reps: int, warmup: int = 2) -> dict:
    """{key: median ms} of calling every fn in `fns` `reps` times, interleaved call by call (so load
    from other processes hits all alike), after `warmup` untimed rounds."""
    times = {k: [] for k in fns}
    for i in range(warmup + reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def format_name_ok(name: str) -> bool:
    """A weight format, or int8 / int4 with `+aten` (aten's kernels, as where the row kernels do not run)."""
    from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS

    fmt, plus, kernels = name.partition("+")
    return fmt in WEIGHT_FORMATS and (not plus or (kernels == "aten" and fmt in ("int8", "int4")))


def format_and_kernels(name: str) -> tuple[str, bool]:
    """(weight format, whether it may take the row kernels) for a format name (see format_name_ok,
    or auto): `+aten` keeps aten's int8 / int4 kernels and SDPA's attention."""
    if name != "auto" and not format_name_ok(name):
        raise SystemExit(f"{name!r}: not a weight format (int8+aten / int4+aten for aten's kernels)")
    fmt, _, kernels = name.partition("+")
    return fmt, not kernels


def load_target_format(path, name: str):
    """TargetModel of `path` in format `name` (see format_and_kernels)."""
    from sglang_dspark.engine.target_model import TargetModel

    from sglang_dspark.engine.cpu.formats import WeightFormat

    fmt, row_kernels = format_and_kernels(name)
    return TargetModel.from_pretrained(str(path), weight_format=WeightFormat.of(fmt, row_kernels=row_kernels))


def write_result(path, result: dict) -> None:
    """A benchmark's JSON (indented, one trailing newline) at `path`, and the line that says so."""
    import json

    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


def drafting_saved_ms(steps, probe: bool) -> float | None:
    """What a run's drafted steps (planned ones, or probes) saved, in ms: each one against the
    undrafted steps of its batch size in the same run (their median) that would have emitted its
    tokens; negative where drafting cost time. Within one run, so a host that slows or speeds up
    between runs moves both sides. None without such steps, or undrafted ones to price them.
    `steps`: StepRecords or their dicts (bs, drafted, probe, accepted_drafts, step_ms)."""
    rows = [s if isinstance(s, dict) else vars(s) for s in steps]
    plain: dict[int, list[float]] = {}
    for r in rows:
        if not r["drafted"]:
            plain.setdefault(r["bs"], []).append(r["step_ms"])
    saved = [statistics.median(plain[r["bs"]]) * (r["bs"] + r["accepted_drafts"]) / r["bs"] - r["step_ms"]
             for r in rows if r["drafted"] and r["probe"] == probe and r["bs"] in plain]
    return sum(saved) if saved else None

"""Served decode speed: launched servers over HTTP, arm against arm, as users meet them.

Arms (`--arms`), each a `python -m sglang_dspark.launch` server on loopback:
- `target`: `--mode target`, started on warm caches: the baseline every ratio is taken against;
- `default`: the default launch (scheduled DSpark) on warm caches: a restart;
- `first-launch`: the default launch with a `HOME` of its own, empty, so the launch itself converts
  the model and builds the row kernels, and then serves for its life: a new user's first launch;
- `first-launch-target`: the same with `--mode target`.

Servers start one at a time (what a server times at start sees an idle host) and stay up, each on
the launch's own thread default (with `--pause-idle`, the servers not being measured are paused with
SIGSTOP, as if the measured one had the host alone). For each concurrency C, every repeat sends the same 2*C held-out chat
prompts, at most C in flight, greedy (or at `--temperature`, prompt i seeded `--seed` + i),
`--max-tokens` tokens each (`ignore_eos`), to every arm, the arms in a carry-over balanced order (`common.balanced_order`). Reported per arm and C: output tok/s
(completion tokens over the wall time of the set), the median over repeats, and per repeat each
arm's ratio to `target` in the same repeat, with the median of those ratios. Each server's startup
seconds and its `/server_info` threads block (engine/threads.py) are kept beside them.

    python benchmarks/served_speed.py [--concurrency 1,4,16] [--max-tokens 128] [--repeats 5]
        [--arms target,default,first-launch] [--temperature 0.8 --seed 1]

Answers are compared too: first target-only answers every prompt one at a time (C = 1), then every
arm's answer at every C and repeat is compared with it (greedy, or seeded: the same text whatever the
load either way).

Writes benchmarks/results/served_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import ROOT, balanced_order, drafting_saved_ms, write_result

from sglang_dspark.prompts import load_prompts
from sglang_dspark.testing.servers import free_port, start_reference_server, stop

ARMS = {  # arm -> (launch flags, fresh HOME)
    "target": (("--mode", "target"), False),
    "default": ((), False),
    "first-launch": ((), True),
    "first-launch-target": (("--mode", "target"), True),
}


def start(arm: str, model: str, home_root: Path) -> dict:
    flags, fresh = ARMS[arm]
    env = {}
    if fresh:
        home = home_root / arm
        home.mkdir()
        env["HOME"] = str(home)
    port = free_port()
    t0 = time.perf_counter()
    proc = start_reference_server("--model", model, *flags, port=port, timeout_s=1800, env=env)
    return {"proc": proc, "url": f"http://127.0.0.1:{port}", "startup_s": round(time.perf_counter() - t0, 1)}


def running_alone(servers: dict[str, dict], arm: str | None, pause_idle: bool) -> None:
    """With `pause_idle`, let only `arm`'s server run (SIGCONT its process group, SIGSTOP every other),
    or every one with None: users run one server on a host, here several share its cores."""
    if not pause_idle:
        return
    for name, server in servers.items():
        try:
            os.killpg(server["proc"].pid, signal.SIGCONT if arm is None or name == arm else signal.SIGSTOP)
        except ProcessLookupError:  # a server that already exited: `stop` reports it
            pass


def one_set(url: str, prompts: list[str], concurrency: int, max_tokens: int, temperature: float = 0.0,
            seed: int | None = None) -> dict:
    """The prompts at most `concurrency` at a time; completion tokens over the set's wall time. With a
    `seed`, prompt i is sent with seed + i (the same prompt always draws from the same seed)."""
    def request(item: tuple[int, str]) -> tuple[int, float, str]:
        i, prompt = item
        t0 = time.perf_counter()
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": temperature, "ignore_eos": True}
        if seed is not None:
            body["seed"] = seed + i
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
        r.raise_for_status()
        reply = r.json()
        return reply["usage"]["completion_tokens"], time.perf_counter() - t0, reply["choices"][0]["message"]["content"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(request, enumerate(prompts)))
    wall = time.perf_counter() - t0
    tokens = sum(n for n, _, _ in done)
    latency = sorted(s for _, s, _ in done)
    return {"output_tok_s": round(tokens / wall, 2), "completion_tokens": tokens, "wall_s": round(wall, 3),
            "request_s_median": round(latency[len(latency) // 2], 3), "request_s_max": round(latency[-1], 3),
            "texts": [text for _, _, text in done]}


def drafting_summary(info: dict) -> dict | None:
    """A DSpark server's drafted steps over the steps it keeps on record (/server_info)."""
    record = info["internal_states"][0]["dspark_info_record"]
    if record.get("mode") == "target":
        return None
    steps = record["records"]
    drafted = [r for r in steps if r["drafted"]]
    total_ms = sum(r["step_ms"] for r in steps) or 1.0
    return {"decode_steps": record["decode_steps"], "probe_steps": record["probe_steps"],
            "steps_on_record": len(steps), "drafted_steps": len(drafted),
            "drafted_share_of_time": round(sum(r["step_ms"] for r in drafted) / total_ms, 4),
            "drafting_saved_share": {kind: drafting_saved_share(steps, probe) for kind, probe
                                     in (("planned", False), ("probes", True))},
            # the drafted steps that cost most: a few outliers (one-time work on a new shape?) can
            # outweigh every other drafted step
            "slowest_drafted": [{k: r[k] for k in ("bs", "budget", "num_verify_tokens", "accepted_drafts", "probe", "predicted_step_ms",
                                                   "step_ms", "draft_ms", "target_verify_ms", "time")}
                                for r in sorted(drafted, key=lambda r: r["step_ms"], reverse=True)[:5]],
            "sps_source": record["sps_source"]}


def drafting_saved_share(steps: list[dict], probe: bool) -> float | None:
    """What the drafted steps (planned ones, or probes) saved, as a share of the steps' time
    (`common.drafting_saved_ms`); negative where drafting cost time."""
    saved, total_ms = drafting_saved_ms(steps, probe), sum(r["step_ms"] for r in steps)
    return round(saved / total_ms, 4) if saved is not None and total_ms else None


def text_agreement(runs: dict[str, list[dict]], reference: dict[int, str]) -> dict:
    """Per arm: (answers equal to target-only's at C = 1, answers compared), over every repeat (at the
    run's temperature and seeds: the same text whatever the load is the promise for both)."""
    out = {}
    for arm, rs in runs.items():
        pairs = [(text, reference[i]) for r in rs for i, text in enumerate(r["texts"]) if i in reference]
        out[arm] = [sum(a == b for a, b in pairs), len(pairs)]
    return out


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per arm the median speed and all of them; per arm but target the per-repeat ratios to target
    and their median."""
    row = {arm: {"output_tok_s_median": round(statistics.median(r["output_tok_s"] for r in rs), 2),
                 "runs_output_tok_s": [r["output_tok_s"] for r in rs],
                 "runs_request_s_max": [r["request_s_max"] for r in rs],
                 "texts": rs[0]["texts"]} for arm, rs in runs.items()}
    for arm in (a for a in runs if a != "target"):
        ratios = [a["output_tok_s"] / t["output_tok_s"] for a, t in zip(runs[arm], runs["target"])]
        row[f"{arm}_vs_target_per_repeat"] = [round(x, 3) for x in ratios]
        row[f"{arm}_vs_target"] = round(statistics.median(ratios), 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name (launch --model)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=128, help="completion tokens per request")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved sets per arm and concurrency")
    parser.add_argument("--arms", default="target,default,first-launch",
                        help=f"comma-separated, target first, of {', '.join(ARMS)}")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="every request's temperature; above 0 pair it with --seed (default: greedy)")
    parser.add_argument("--seed", type=int, default=None,
                        help="prompt i is sent with seed + i, so its text should not depend on the load (default: none)")
    parser.add_argument("--pause-idle", action="store_true",
                        help="pause (SIGSTOP) every server but the one being measured, resume it for its sets")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/served_speed.json"), help="JSON output path")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if arms[0] != "target" or set(arms) - set(ARMS) or len(set(arms)) != len(arms):
        raise SystemExit(f"--arms: target first, then any of {', '.join(ARMS)}; got {args.arms}")
    levels = [int(c) for c in args.concurrency.split(",")]
    records = load_prompts("builtin:heldout")
    servers: dict[str, dict] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="served-speed-") as home_root:
        try:
            for arm in arms:
                servers[arm] = start(arm, args.model, Path(home_root))
                print(f"{arm}: ready in {servers[arm]['startup_s']} s on {servers[arm]['url']}", flush=True)
            every = [records[i % len(records)].prompt for i in range(2 * max(levels))]
            sampling = {"temperature": args.temperature, "seed": args.seed}
            running_alone(servers, arms[0], args.pause_idle)
            reference = dict(enumerate(one_set(servers[arms[0]]["url"], every, 1, args.max_tokens, **sampling)["texts"]))
            for c in levels:
                prompts = [records[i % len(records)].prompt for i in range(2 * c)]
                for arm in arms:  # warm-up: one set each, not counted
                    running_alone(servers, arm, args.pause_idle)
                    one_set(servers[arm]["url"], prompts[:c], c, 8, **sampling)
                runs: dict[str, list[dict]] = {arm: [] for arm in arms}
                for repeat in range(args.repeats):
                    for arm in balanced_order(arms, repeat):
                        running_alone(servers, arm, args.pause_idle)
                        runs[arm].append(one_set(servers[arm]["url"], prompts, c, args.max_tokens, **sampling))
                row = {"concurrency": c, **summarize(runs)}
                row["text_equal_to_target_at_c1"] = text_agreement(runs, reference)
                rows.append(row)
                print(f"C={c}: " + "  ".join(f"{a} {row[a]['output_tok_s_median']:.1f} tok/s" for a in arms) + "  |  "
                      + "  ".join(f"{a}/target {row[a + '_vs_target']:.3f}" for a in arms[1:]) + "  |  same text as target at C=1: "
                      + "  ".join(f"{a} {e}/{n}" for a, (e, n) in row["text_equal_to_target_at_c1"].items()), flush=True)
            running_alone(servers, None, args.pause_idle)
            infos = {arm: httpx.get(f"{s['url']}/server_info", timeout=30).json() for arm, s in servers.items()}
            threads = {arm: info.get("threads") for arm, info in infos.items()}
            drafting = {arm: drafting_summary(info) for arm, info in infos.items()}
        finally:
            running_alone(servers, None, args.pause_idle)
            for s in servers.values():
                stop(s["proc"])
    print(f"\n{'C':>3} " + "".join(f"{a:>22}" for a in arms) + "".join(f"{a + '/target':>26}" for a in arms[1:]))
    for row in rows:
        print(f"{row['concurrency']:>3} " + "".join(f"{row[a]['output_tok_s_median']:>18.1f} tok/s" for a in arms)
              + "".join(f"{row[a + '_vs_target']:>26.3f}" for a in arms[1:]))
    write_result(args.out, {
        "host": platform.processor() or platform.machine(), "arms": arms, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "seed": args.seed,
        "repeats": args.repeats, "pause_idle": args.pause_idle, "startup_s": {a: s["startup_s"] for a, s in servers.items()},
        "threads": threads, "drafting": drafting, "rows": rows})
    for arm, d in drafting.items():
        if d:
            print(f"{arm}: {d['drafted_steps']} drafted steps ({d['probe_steps']} probes) in the last "
                  f"{d['steps_on_record']} of {d['decode_steps']} decode steps; {d['drafted_share_of_time']:.1%} of "
                  f"their time; saved against plain steps of the same batch (negative: cost): "
                  + ", ".join(f"{k} {v:+.1%}" if v is not None else f"{k} -" for k, v in d["drafting_saved_share"].items()))
            print("  slowest drafted steps (bs, budget, probe, ms): " + "; ".join(
                f"{r['bs']}, {r['budget']}, {r['probe']}, {r['step_ms']:.1f}" for r in d["slowest_drafted"]))


if __name__ == "__main__":
    main()

"""Decode speed of the reference engine, arm against arm: target-only, verify-all, and DSpark scheduled
the way `launch` would run it here.

Arms (`--arms`):
- `target`: no speculation; `full`: DSpark verifying every draft;
- `default`: scheduled, with the SPS table `launch` picks for `--profile` on this host: the profile
  corrected online when its fingerprint matches ("profile+online", the profiled path), a seed
  scaled to this host's steps when only the hardware differs ("seeded+online");
- `online`: scheduled with no profile at all, the table learned from nothing;
- `static`: scheduled on the profile's table as measured, no online learning (`--sps-learning off
  --force-profile`, the scheduler before online learning);
- `seeded`: scheduled on `--seed-profile` (a profile captured on other hardware; by default a copy
  of `--profile` whose hardware field names another CPU) the way `launch` uses it on this host:
  "seeded+online". With `default` on a profile of this host, one run measures both launch paths.
- `fitted`: `default` with the throughput planner taking the table's prices of drafted steps at their
  word (no time margin: engine/policy.py `_time_margin`);
- `nolag`: `default` with the planner reading its lagged confidences as they are, uncorrected
  (core/lag_calibration.py off: the scheduler before lag calibration);
- `fixedK` (K = 1 .. gamma): scheduled, every step's budget forced to K drafts a request (the sweep
  the default is measured against: `default_vs_best_fixed` is the default over the best of target-only,
  verify-all and every fixed arm in the same repeat);
- diagnostics of what `default` pays when it drafts nothing: `dormant`, the default engine whose
  planner never drafts (no probes either; the drafter's context is still captured and staged, the
  policy and learner still run), and `dormant-nostage`, the same without staging that context.

With `--controlled-acceptance A` every drafting arm drafts through `ControlledDrafter`
(sglang_dspark/testing/controlled_drafter.py): the target's own greedy continuation (computed first by a
target-only engine), each position replaced with probability 1 - A, confidences saying A
(+ `--controlled-calibration-error`), at the shipped drafter's cost times `--controlled-cost`: the
scheduler measured apart from the drafter.

For each concurrency C every arm serves the same 2*C held-out chat prompts with at most C running,
each run on a fresh engine (a run pays its own learning; with `--persistent` one engine per arm and
C serves every repeat, as a long-running server would, so only the first repeat pays it); arms run
back to back inside each
concurrency, in an order balanced for carry-over (`common.balanced_order`: over len(arms) repeats each
arm runs right after every other one equally often), so host drift hits them alike. Reported: output tokens/s
(completion tokens over wall time), tau (tokens per request per decode step), the median run per arm,
and per repeat the ratio of `default` to target-only and to the best of target-only and verify-all,
with their medians over repeats.

    python benchmarks/decode_speed.py [--concurrency 1,4,16] [--max-tokens 96] [--repeats 5]
        [--arms target,full,default,online] [--profile sla_profiles/smollm2-135m-instruct-cpu.yaml]
        [--seed-profile OTHER_HOST.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch
from common import (add_common_args, balanced_order, drafting_saved_ms, force_drafts_per_request, heldout_prompts, load_pair,
                    serve_all)

DORMANT = ("dormant", "dormant-nostage")
ARMS = ("target", "full", "default", "nolag", "fitted", "online", "static", "seeded", *DORMANT)
SCHEDULED = ("default", "nolag", "fitted", "online", "static", "seeded", *DORMANT)


def run_mode(engine, prompts: list[list[int]], params) -> dict:
    run = serve_all(engine, prompts, params)
    records = run.records
    emitted = sum(r.bs + r.accepted_drafts for r in records)
    errors = [abs(r.predicted_step_ms - r.step_ms) / r.step_ms for r in records if r.predicted_step_ms]
    plain = [r.step_ms for r in records if not r.drafted]
    drafted = [r for r in records if r.drafted]
    return {
        "predicted_step_time_median_abs_rel_error": round(statistics.median(errors), 4) if errors else None,
        "output_tok_s": round(run.completion_tokens / run.wall_s, 2),
        "tau": round(emitted / max(1, sum(r.bs for r in records)), 3),
        "wall_s": round(run.wall_s, 2),
        "completion_tokens": run.completion_tokens,
        "mean_verify_tokens_per_step": round(sum(r.num_verify_tokens for r in records) / max(1, len(records)), 2),
        "steps": len(records),
        # where the time went: plain steps, drafted ones (probes among them), and outside decode steps
        "plain_step_ms_median": round(statistics.median(plain), 2) if plain else None,
        "drafted_steps": len(drafted), "probe_steps": sum(r.probe for r in drafted),
        "drafted_s": round(sum(r.step_ms for r in drafted) / 1e3, 3),
        "outside_decode_s": round(run.wall_s - sum(r.step_ms for r in records) / 1e3, 3),
        # what drafting saved (negative: cost) against this run's own plain steps: host noise between
        # runs, which swamps small speed ratios, cancels out of it
        **{f"saved_by_{kind}_s": None if (ms := drafting_saved_ms(records, probe)) is None else round(ms / 1e3, 4)
           for kind, probe in (("planned", False), ("probes", True))},
    }


def saved_shares(runs: dict[str, list[dict]], arms) -> dict:
    """Per scheduled arm: what its planned drafted steps and its probes saved over all its runs, as a
    share of its decode time (`saved_by_*_s` over the runs' wall less what was outside decode steps)."""
    out = {}
    for arm in arms:
        if arm in ("target", "full"):
            continue
        decode_s = sum(r["wall_s"] - r["outside_decode_s"] for r in runs[arm]) or 1.0
        out[arm] = {kind: round(sum(r[f"saved_by_{kind}_s"] or 0.0 for r in runs[arm]) / decode_s, 4)
                    for kind in ("planned", "probes")}
    return out


def summarize_arms(row: dict, runs: dict[str, list[dict]], arms) -> dict:
    """`row` with each arm's median-speed run (all runs' speeds kept) and the speed ratios: per
    repeat, each arm over target-only and over the better of target-only and verify-all in the same
    repeat, and their medians."""
    for arm in arms:  # the run with the median speed stands for the arm; all runs are kept
        ordered = sorted(runs[arm], key=lambda r: r["output_tok_s"])
        row[arm] = {**ordered[len(ordered) // 2], "runs_output_tok_s": [r["output_tok_s"] for r in runs[arm]]}
    speed = {arm: [r["output_tok_s"] for r in runs[arm]] for arm in arms}
    vs_target = [d / t for d, t in zip(speed["default"], speed["target"])]
    vs_best = [d / max(t, f) for d, t, f in zip(speed["default"], speed["target"], speed["full"])]
    row["default_vs_target_per_repeat"] = [round(x, 3) for x in vs_target]
    row["default_vs_best_per_repeat"] = [round(x, 3) for x in vs_best]
    row["default_vs_target"] = round(statistics.median(vs_target), 3)
    row["default_vs_best"] = round(statistics.median(vs_best), 3)
    row["full_vs_target"] = round(statistics.median(f / t for f, t in zip(speed["full"], speed["target"])), 3)
    fixed = [a for a in arms if is_fixed(a)]
    if fixed:  # the best fixed budget of the sweep, target-only (0) and verify-all (gamma) included
        best = [max(v) for v in zip(*(speed[a] for a in ("target", "full", *fixed)))]
        row["default_vs_best_fixed_per_repeat"] = [round(d / b, 3) for d, b in zip(speed["default"], best)]
        row["default_vs_best_fixed"] = round(statistics.median(d / b for d, b in zip(speed["default"], best)), 3)
    for arm in (a for a in (*SCHEDULED, *fixed) if a in arms and a != "default"):
        row[f"{arm}_vs_target"] = round(statistics.median(o / t for o, t in zip(speed[arm], speed["target"])), 3)
        row[f"{arm}_vs_best"] = round(statistics.median(
            o / max(t, f) for o, t, f in zip(speed[arm], speed["target"], speed["full"])), 3)
    return row


def is_fixed(arm: str) -> bool:
    return arm.startswith("fixed") and arm[5:].isdigit() and int(arm[5:]) > 0


def engine_for(arm: str, pair, launch_profiles: dict, concurrency: int, model: str, controlled=None):
    """`launch_profiles`: "default" -> what launch resolves --profile to here, "seeded" -> the same
    for --seed-profile (None when the seeded arm does not run). `controlled`: drafter -> a
    ControlledDrafter over it (--controlled-acceptance), or None."""
    from sglang_dspark.engine.engine import Engine, EngineConfig

    target, tokenizer, drafter = pair
    if controlled is not None and arm != "target":
        drafter = controlled(drafter)
    mode = {"target": "target", "full": "full"}.get(arm, "scheduled")
    resolved = launch_profiles["seeded" if arm == "seeded" else "default"]
    profile = resolved.profile
    sps = None if arm in ("target", "full", "online") else profile.sps_table()
    config = EngineConfig(mode=mode, max_running=concurrency, max_len=1024, learn_sps=arm != "static")
    engine = Engine(target, tokenizer, drafter if mode != "target" else None, config=config, sps=sps,
                    sts_temperatures=profile.sts_temperatures(), model_name=model,
                    sps_seeded=arm in ("default", "nolag", "fitted", "seeded", *DORMANT) and resolved.seed_only)
    if controlled is not None and arm != "target":
        drafter.bind(engine)
    if is_fixed(arm):
        force_drafts_per_request(engine, int(arm[5:]), concurrency)
    if arm == "nolag":
        engine.policy.planner.calibration = None
    if arm == "fitted":
        engine.policy.time_margin = False
    if arm in DORMANT:
        from sglang_dspark.engine.policy import NO_DRAFT

        engine.policy.plan = lambda request_ids: NO_DRAFT
        if arm == "dormant-nostage":
            engine.runner.commit = lambda rows, num_accepted, hidden, widths: None
    return engine


def controlled_factory(args, pair, prompts):
    """drafter -> ControlledDrafter over it, proposing the target's own greedy continuation of `prompts`
    (computed here by a target-only engine, a block longer than the replies)."""
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.testing.controlled_drafter import ControlledDrafter

    target, tokenizer, drafter = pair
    engine = Engine(target, tokenizer, None, config=EngineConfig(mode="target", max_running=len(prompts), max_len=1024))
    n = args.max_tokens + drafter.gamma + 1
    replies = engine.generate(prompts, [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)] * len(prompts))
    references = {tuple(p): r for p, r in zip(prompts, replies)}
    made = [0]

    def wrap(inner):
        made[0] += 1
        return ControlledDrafter(inner, references, args.controlled_acceptance,
                                 calibration_error=args.controlled_calibration_error,
                                 cost_multiple=args.controlled_cost, seed=made[0])

    return wrap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "decode_speed")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every arm; the median is reported")
    parser.add_argument("--arms", default="target,full,default,online",
                        help=f"comma-separated, of {', '.join(ARMS)}, fixedK (K drafts a request)")
    parser.add_argument("--force-mismatch", action="store_true",
                        help="treat --profile as measured on other hardware (its hardware field replaced), so "
                             "`default` runs the seeded path even on the host that captured it")
    parser.add_argument("--seed-profile", default=None,
                        help="profile of other hardware for the `seeded` arm (default: --profile with its hardware "
                             "field replaced)")
    parser.add_argument("--controlled-acceptance", type=float, default=None,
                        help="draft with ControlledDrafter at this per-draft acceptance (0-1) instead of the "
                             "drafter's own proposals (default: the drafter's own)")
    parser.add_argument("--controlled-calibration-error", type=float, default=0.0,
                        help="added to the controlled drafter's reported confidence (default: %(default)s)")
    parser.add_argument("--controlled-cost", type=float, default=1.0,
                        help="the controlled drafter's cost as a multiple of the drafter's own; 0 = free "
                             "(default: %(default)s)")
    parser.add_argument("--persistent", action="store_true",
                        help="one engine per arm and concurrency for every repeat (a server that keeps learning)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    arms = tuple(a for a in args.arms.split(",") if a)
    unknown = {a for a in arms if not is_fixed(a)} - set(ARMS)
    if unknown or not {"target", "full", "default"} <= set(arms):
        raise SystemExit(f"--arms: need target, full and default, of {', '.join(ARMS)}, fixedK; got {args.arms}")

    from sglang_dspark import zoo
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.profile.resolve import resolve_profile

    pair = load_pair(args.model, args.draft, args.dtype)
    print(f"weight format: {pair[0].weight_format}", flush=True)
    tokenizer = pair[1]
    if args.force_mismatch:
        args.profile = str(other_hardware_copy(Path(args.profile)))
    def resolved(path: str, arm: str):  # what launch does with this profile on this host
        launch_profile = resolve_profile(path, engine="reference", model=zoo.resolve_model(args.model),
                                         draft=args.draft, seed_ok=True, weight_format=pair[0].weight_format)
        source = "seeded+online" if launch_profile.seed_only else "profile+online"
        print(f"{arm} arm: {source} from {path}" + (f" ({'; '.join(launch_profile.mismatches)})"
                                                    if launch_profile.mismatches else ""), flush=True)
        return launch_profile, source

    launch_profiles, sources = {}, {}
    launch_profiles["default"], sources["default"] = resolved(args.profile, "default")
    if "seeded" in arms:
        seed_path = args.seed_profile or str(other_hardware_copy(Path(args.profile)))
        launch_profiles["seeded"], sources["seeded"] = resolved(seed_path, "seeded")
        if not launch_profiles["seeded"].seed_only:
            raise SystemExit(f"--seed-profile {seed_path}: its hardware matches this host; the seeded arm needs "
                             "a profile of other hardware")
    source = sources["default"]
    launch_profile = launch_profiles["default"]

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=None)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        prompts = heldout_prompts(tokenizer, 2 * concurrency)
        row = {"concurrency": concurrency, "requests": len(prompts)}
        runs = {arm: [] for arm in arms}
        engines = {}
        controlled = controlled_factory(args, pair, prompts) if args.controlled_acceptance is not None else None
        for rep in range(args.repeats):  # interleaved, carry-over balanced: host drift hits every arm alike
            for arm in balanced_order(arms, rep):
                if arm not in engines or not args.persistent:
                    engines[arm] = engine_for(arm, pair, launch_profiles, concurrency, args.model, controlled)
                engine = engines[arm]
                runs[arm].append(run_mode(engine, prompts, params))
                print(f"  C={concurrency:<3} {arm:<9} run {rep + 1}: {runs[arm][-1]['output_tok_s']:>8.2f} tok/s  "
                      f"tau {runs[arm][-1]['tau']:.2f}  drafted steps {runs[arm][-1]['drafted_steps']:>3} "
                      f"({runs[arm][-1]['drafted_s']:.2f} s)  plain step {runs[arm][-1]['plain_step_ms_median'] or 0:.1f} ms"
                      f"  saved by drafting {runs[arm][-1]['saved_by_planned_s'] or 0:+.3f} s, by probes "
                      f"{runs[arm][-1]['saved_by_probes_s'] or 0:+.3f} s",
                      flush=True)
        summarize_arms(row, runs, arms)
        row["saved_by_drafting"] = saved_shares(runs, arms)
        rows.append(row)

    others = [a for a in (*SCHEDULED, *(a for a in arms if is_fixed(a))) if a in arms and a != "default"]
    header = f"\n{'C':>3} " + " ".join(f"{arm + ' tok/s':>14}" for arm in arms) + \
        f" {'tau default':>11} {'default/target':>15} {'default/best':>13}" + \
        "".join(f" {a + '/target':>15} {a + '/best':>13}" for a in others)
    print(header + ("  (medians of per-repeat ratios)"))
    for r in rows:
        print(f"{r['concurrency']:>3} " + " ".join(f"{r[arm]['output_tok_s']:>14.2f}" for arm in arms)
              + f" {r['default']['tau']:>11.2f} {r['default_vs_target']:>15.3f} {r['default_vs_best']:>13.3f}"
              + "".join(f" {r[a + '_vs_target']:>15.3f} {r[a + '_vs_best']:>13.3f}" for a in others))
    print("\nsaved by planned drafted steps / by probes, share of the arm's decode time over all repeats "
          "(each drafted step against its run's plain steps; negative: cost)")
    for r in rows:
        print(f"{r['concurrency']:>3} " + "  ".join(
            f"{arm} {v['planned']:+.2%} / {v['probes']:+.2%}" for arm, v in r["saved_by_drafting"].items()))
    result = {
        "benchmark": "decode_speed",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch_threads": args.threads,
                    "hardware": profile_hardware()},
        "model": args.model, "draft": args.draft, "weight_format": pair[0].weight_format, "profile": args.profile,
        "default_source": source,
        "seed_profile": launch_profiles["seeded"].path if "seeded" in arms else None,
        "sources": sources,
        "forced_mismatch": args.force_mismatch,
        "persistent_engines": args.persistent,
        "profile_mismatches": launch_profile.mismatches, "arms": list(arms),
        "max_tokens": args.max_tokens, "temperature": args.temperature, "repeats": args.repeats,
        "controlled": None if args.controlled_acceptance is None else {
            "acceptance": args.controlled_acceptance, "calibration_error": args.controlled_calibration_error,
            "cost_multiple": args.controlled_cost},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, arms, Path(args.out).with_suffix(".png"), title=f"{args.model}, default = {source}")
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.png')}")


def plot(rows: list[dict], arms: tuple[str, ...], path: Path, title: str) -> None:
    """Per concurrency, each arm's speed relative to target-only: every repeat a dot, the median a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        for j, row in enumerate(rows):
            ratios = [a / t for a, t in zip(row[arm]["runs_output_tok_s"], row["target"]["runs_output_tok_s"])]
            x = j + (i - (len(arms) - 1) / 2) * width
            ax.bar(x, statistics.median(ratios), width * 0.9, color=f"C{i}", label=arm if j == 0 else None)
            ax.plot([x] * len(ratios), ratios, "k.", ms=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.97, color="r", lw=0.8, ls="--", label="0.97 x target-only")
    ax.set_xticks(range(len(rows)), [f"C = {r['concurrency']}" for r in rows])
    ax.set_ylabel("output tok/s relative to target-only (same repeat)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def other_hardware_copy(path: Path) -> Path:
    """A copy of the profile whose fingerprint names another CPU (written under runs/)."""
    from sglang_dspark.profile.schema import SlaProfile

    profile = SlaProfile.load(path)
    fp = profile.fingerprint.model_copy(update={"hardware": "cpu: another CPU model (forced mismatch)"})
    out = Path(__file__).resolve().parents[1] / "runs" / f"{path.stem}.other-hardware.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.replaced(fingerprint=fp).save(out)
    return out


def profile_hardware() -> str:
    from sglang_dspark.profile.fingerprint import hardware_id

    return hardware_id()


if __name__ == "__main__":
    main()

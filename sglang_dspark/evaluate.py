"""python -m sglang_dspark.evaluate --target DIR --draft DRAFT_DIR [--prompts-file SPEC] --json

Offline drafter quality: accepted length tau (bonus included) per domain and per position at
temperature 0 and 1 with chain drafting and full-block verification (every draft verified,
lossless rejection sampling), on held-out prompts with the chat template applied; plus
confidence calibration: STS temperatures fitted on the calibration split, cumulative ECE and
AUROC per position before/after on the evaluation split.

Every split is decoded by the reference engine in full-verify mode, all prompts batched, and the
engine reports each drafted round through its round observer. The greedy-equality check decodes
held-out prompts the same way and compares with transformers' own `generate(do_sample=False)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from sglang_dspark.core.calibration import OBJECTIVES, calibration_report, fit_sts
from sglang_dspark.prompts import chat_ids


def run_split(engine, records, temperature, max_new_tokens, desc=""):
    """All records (PromptRecords) decoded together by `engine` (an Engine, normally in full
    mode). Returns per prompt {"domain", "accept_lens", "conf_logits", "tokens"}, one entry of the
    first two per drafted round."""
    from sglang_dspark.engine.sampling import SamplingParams

    rounds = defaultdict(list)
    remove = engine.add_round_observer(
        lambda rid, accepted, verified, conf: rounds[rid].append((accepted, conf.float().clone())))
    ids = [f"{desc}-{i}" for i in range(len(records))]
    try:
        outputs = engine.generate([chat_ids(engine.tokenizer, r.prompt) for r in records],
                                  [SamplingParams(max_tokens=max_new_tokens, temperature=temperature)] * len(records),
                                  request_ids=ids, progress=f"{desc} T={temperature:g}")
    finally:
        remove()
    return [{"domain": rec.domain, "accept_lens": [m for m, _ in rounds[rid]],
             "conf_logits": [c for _, c in rounds[rid]], "tokens": out}
            for rid, rec, out in zip(ids, records, outputs)]


def summarize(results, gamma) -> dict:
    by_domain = defaultdict(list)
    for r in results:
        by_domain[r["domain"]].extend(r["accept_lens"])
    out = {}
    for domain, lens in sorted(by_domain.items()):
        m = torch.tensor(lens, dtype=torch.float64)
        out[domain] = {
            "tau": float((m + 1).mean()) if len(lens) else float("nan"),
            "rounds": len(lens),
            # P(draft k accepted) = fraction of rounds whose accepted prefix reaches k.
            "accept_rate_per_position": [float((m >= k).double().mean()) for k in range(1, gamma + 1)],
        }
    return out


def evaluate(target_dir, draft_dir, eval_records, calib_records, *, temperatures=(0.0, 1.0),
             calibration_temperatures=(1.0,), max_new_tokens=96, seed=0, sts_objective="ece",
             rounds_out=None) -> dict:
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine

    config = EngineConfig(mode="full", max_running=max(len(eval_records), len(calib_records)), seed=seed,
                          max_len=2048)
    engine = build_engine(target_dir, draft_dir, config=config)
    gamma = engine.gamma
    report = {"target": str(target_dir), "draft": str(draft_dir), "gamma": gamma,
              "max_new_tokens": max_new_tokens, "seed": seed, "by_temperature": {}}
    for temp in temperatures:
        first_step = engine.records.total
        evals = run_split(engine, eval_records, temp, max_new_tokens, "eval")
        steps = engine.records.since(first_step)
        entry = {"domains": summarize(evals, gamma)}
        taus = [d["tau"] for d in entry["domains"].values()]
        entry["macro_tau"] = sum(taus) / len(taus)
        entry["draft_ms_per_step"] = sum(r.draft_ms for r in steps) / max(len(steps), 1)
        entry["target_ms_per_step"] = sum(r.target_verify_ms for r in steps) / max(len(steps), 1)
        if engine.runner.drafter.confidence_head is not None and calib_records and temp in calibration_temperatures:
            calib = run_split(engine, calib_records, temp, max_new_tokens, "calib")
            conf_c, len_c = _stack(calib, gamma)
            conf_e, len_e = _stack(evals, gamma)
            temps = fit_sts(conf_c, len_c, objective=sts_objective)
            entry["sts_objective"] = sts_objective
            entry["sts_temperatures"] = temps.tolist()
            entry["calibration_rounds"] = int(len_c.numel())
            entry["calibration"] = calibration_report(conf_e, len_e, temps)
            if rounds_out:  # the raw rounds, for refitting STS offline (benchmarks/sts_calibration.py)
                save_rounds(f"{rounds_out}.t{temp:g}.pt", temp, gamma, {"eval": evals, "calibration": calib})
        report["by_temperature"][f"{temp:g}"] = entry
    # Headline per-domain numbers at temperature 1 (the paper's setting), the others alongside.
    headline = report["by_temperature"].get("1", next(iter(report["by_temperature"].values())))
    report["domains"] = {
        d: {"tau": v["tau"], **{f"tau_t{t}": e["domains"][d]["tau"]
                                 for t, e in report["by_temperature"].items()}}
        for d, v in headline["domains"].items()
    }
    report["macro_tau"] = headline["macro_tau"]
    return report


def save_rounds(path, temperature, gamma, splits: dict) -> None:
    """Per split: conf_logits [N, G], accept_len [N], and each round's prompt index and domain."""
    data = {"temperature": temperature, "gamma": gamma}
    for name, results in splits.items():
        conf, lens = _stack(results, gamma)
        prompt = [i for i, r in enumerate(results) for _ in r["accept_lens"]]
        data[name] = {"conf_logits": conf, "accept_len": lens, "prompt": torch.tensor(prompt, dtype=torch.long),
                      "domain": [r["domain"] for r in results]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)


def _stack(results, gamma):
    conf = [c for r in results for c in r["conf_logits"]]
    lens = [m for r in results for m in r["accept_lens"]]
    if not conf:
        return torch.zeros(0, gamma), torch.zeros(0, dtype=torch.long)
    return torch.stack(conf).float(), torch.tensor(lens)


def greedy_equality(target_dir, draft_dir, num_prompts: int, max_new_tokens: int) -> dict:
    """Greedy speculative output of the engine (full verify, all prompts batched) vs transformers'
    generate(do_sample=False), one prompt at a time, on held-out prompts."""
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.prompts import load_prompts
    from sglang_dspark.train.data import load_target

    records = load_prompts("builtin:heldout")
    records = [records[i * len(records) // num_prompts] for i in range(num_prompts)]
    engine = build_engine(target_dir, draft_dir, config=EngineConfig(mode="full", max_running=num_prompts, max_len=2048))
    t0 = time.perf_counter()
    results = run_split(engine, records, 0.0, max_new_tokens, "greedy")
    speculative_s = time.perf_counter() - t0
    hf, tokenizer = load_target(target_dir)
    rows = []
    for i, (rec, res) in enumerate(zip(records, results)):
        ids = chat_ids(tokenizer, rec.prompt)
        t0 = time.perf_counter()
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                              pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        ref = ref[: ref.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in ref else ref  # EOS is not emitted
        first_diff = next((j for j, (a, b) in enumerate(zip(res["tokens"], ref)) if a != b), None)
        equal = res["tokens"] == ref
        tau = (len(res["tokens"]) - 1) / max(len(res["accept_lens"]), 1)
        rows.append({"domain": rec.domain, "tokens": len(ref), "equal": equal, "first_difference": first_diff,
                     "tau": tau, "generate_s": time.perf_counter() - t0})
        print(f"[{i + 1}/{num_prompts}] {rec.domain:>5} tokens={len(ref)} equal={equal} tau={tau:.2f}",
              file=sys.stderr, flush=True)
    return {"target": str(target_dir), "draft": str(draft_dir), "max_new_tokens": max_new_tokens,
            "num_prompts": num_prompts, "all_equal": all(r["equal"] for r in rows), "speculative_s": speculative_s,
            "prompts": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--draft", required=True, help="drafter checkpoint directory")
    p.add_argument("--prompts-file", default="builtin:eval", help="evaluation prompts: a JSONL file of "
                   "{\"domain\", \"prompt\"} lines, builtin:<split>, mt-bench, humaneval or sharegpt "
                   "(default: %(default)s)")
    p.add_argument("--calibration-file", default="builtin:calibration",
                   help="STS calibration prompts, the same kinds of source (default: %(default)s)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated sampling temperatures")
    p.add_argument("--calibration-temperatures", default="1",
                   help="temperatures at which STS is fitted and ECE/AUROC reported")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts of each split")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--out", help="also write the JSON report to this file")
    p.add_argument("--sts-out", help="write the fitted STS temperatures (first calibration temperature) as "
                   "SGLang's DSparkStsCalibration JSON, for `profile capture --sts` and SGLang's "
                   "--speculative-dspark-confidence-sts-path")
    p.add_argument("--sts-objective", choices=OBJECTIVES, default="ece",
                   help="what each STS temperature minimises on the calibration split: the paper's "
                   "cumulative ECE, or the log loss (less prone to fit the noise of a small split)")
    p.add_argument("--rounds-out", help="save every round's raw confidences and accepted length, per split, "
                   "to PREFIX.t<temperature>.pt (for benchmarks/sts_calibration.py)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from sglang_dspark.prompts import load_prompts

    try:
        eval_records, calib_records = load_prompts(args.prompts_file), load_prompts(args.calibration_file)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.limit:
        eval_records, calib_records = _per_domain(eval_records, args.limit), _per_domain(calib_records, args.limit)
    temps = tuple(float(t) for t in args.temperatures.split(","))
    report = evaluate(args.target, args.draft, eval_records, calib_records, temperatures=temps,
                      calibration_temperatures=tuple(float(t) for t in args.calibration_temperatures.split(",")),
                      max_new_tokens=args.max_new_tokens, seed=args.seed,
                      sts_objective=args.sts_objective, rounds_out=args.rounds_out)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    if args.sts_out:
        sts = sts_from_report(report, dataset=args.calibration_file)
        if sts is None:
            print("error: no STS was fitted (no confidence head, or no calibration temperature among "
                  "--temperatures)", file=sys.stderr)
            return 2
        Path(args.sts_out).parent.mkdir(parents=True, exist_ok=True)
        sts.save(args.sts_out)
    if args.json:
        print(text)
    else:
        for domain, v in report["domains"].items():
            print(f"{domain:>8}: " + "  ".join(f"{k}={x:.3f}" for k, x in v.items()))
    return 0


def sts_from_report(report: dict, dataset: str):
    """The first temperature's fitted STS as SGLang's calibration struct (None if none was fitted)."""
    from sglang_dspark.core.calibration import StsCalibration

    for entry in report["by_temperature"].values():
        if "sts_temperatures" in entry:
            calib = entry["calibration"]
            return StsCalibration(temperatures=entry["sts_temperatures"], dataset=dataset,
                                  num_samples=entry["calibration_rounds"],
                                  ece_before=calib["ece_before"], ece_after=calib["ece_after"])
    return None


def _per_domain(records, limit):
    seen = defaultdict(int)
    kept = []
    for r in records:
        if seen[r.domain] < limit:
            kept.append(r)
            seen[r.domain] += 1
    return kept


if __name__ == "__main__":
    sys.exit(main())

"""python -m sglang_dspark.evaluate --target DIR --draft DRAFT_DIR [--bench mt-bench --bench humaneval]
    [--profile PROFILE.yaml] [--out REPORT.json] [--markdown REPORT.md]

Offline drafter quality: accepted length tau (bonus included) per benchmark category and per
position at temperature 0 and 1 with chain drafting and full-block verification (every draft
verified, lossless rejection sampling), on prompts with the chat template applied (MT-Bench: the
first turn of each question). Printed as the paper's tables (Markdown), with the speedup a
profile's SPS table predicts from the measured acceptance when --profile is given; plus
confidence calibration: STS temperatures fitted on the calibration split, cumulative ECE and
AUROC per position before/after on the benchmarks' rounds.

Every split is decoded by the reference engine in full-verify mode, all prompts batched, and the
engine reports each drafted round through its round observer. The greedy-equality check decodes
held-out prompts the same way and compares with transformers' own `generate(do_sample=False)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from sglang_dspark.engine.cpu.names import FORMAT_CHOICES
from sglang_dspark.core.calibration import OBJECTIVES, calibration_report, fit_sts
from sglang_dspark.prompts import chat_ids

HELDOUT_SPEC = "sharegpt-heldout"


def run_split(engine, records, temperature, max_new_tokens, desc=""):
    """All records (PromptRecords) decoded together by `engine` (an Engine, normally in full
    mode). Returns per prompt {"domain", "accept_lens", "conf_logits", "tokens"}, one entry of the
    first two per drafted round."""
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.train.engine_tau import decode_rounds, fitting_prompts

    kept, prompts = fitting_prompts(engine, records, max_new_tokens)
    if len(kept) < len(records):
        print(f"{desc}: {len(records) - len(kept)} of {len(records)} prompts left out: longer than the "
              f"{engine.max_len}-token context with {max_new_tokens} new tokens", file=sys.stderr)
    records = kept
    ids = [f"{desc}-{i}" for i in range(len(records))]
    outputs, rounds = decode_rounds(engine, prompts,
                                    [SamplingParams(max_tokens=max_new_tokens, temperature=temperature)] * len(records),
                                    ids, progress=f"{desc} T={temperature:g}")
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


def bench_prompts(spec: str) -> list:
    """Prompt records of a --bench / --calibration-file spec: anything `load_prompts` reads, or
    `sharegpt-heldout`, the ShareGPT pool no training run uses (sglang_dspark/train/sources.py).
    A `:N` suffix keeps the first N prompts of each category (`mt-bench:4`: 4 of each of 8)."""
    from sglang_dspark.prompts import load_prompts

    head, _, count = spec.rpartition(":")
    if not (head and count.isdigit()):
        head, count = spec, ""
    if head == HELDOUT_SPEC:
        from sglang_dspark.train.sources import sharegpt_pool

        records = sharegpt_pool("heldout")
    else:
        records = load_prompts(head)
    return _per_domain(records, int(count)) if count else records


def sps_from_profile(path):
    """The SPS table of an SLA profile's YAML (its `sps` section, read as the profile package
    does: the additive fit with the drafter-skip saving when present, else the 1-D table). The
    fingerprint is not checked: the prediction is for the hardware the profile was captured on."""
    import yaml

    from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable

    sps = yaml.safe_load(Path(path).read_text())["sps"]
    if sps.get("additive"):
        return SpsTable(SpsAdditiveCostTable.model_validate(sps["additive"]), sps.get("draft_skip_seconds"))
    return SpsTable(SpsCostTable.model_validate(sps["cost"]))


def speedup_curve(accept: list[float], sps) -> list[float]:
    """Predicted single-request speedup over target-only decoding when verifying k = 0..G drafts:
    (1 + a_1 + ... + a_k) * T0 / T(1 + k), with a_j = P(the first j drafts accepted), T0 the
    profile's undrafted step at one request and T(1 + k) its drafted step of 1 + k tokens."""
    t0 = 1.0 / sps(1, num_requests=1, drafted=False)
    tokens = 1.0
    curve = [1.0]
    for k, a in enumerate(accept, start=1):
        tokens += a
        curve.append(tokens * t0 * sps(1 + k, num_requests=1, drafted=True))
    return curve


def with_speedup(summary: dict, sps) -> dict:
    """A category or bench summary plus, given an SPS table, its predicted speedups: verifying
    every draft (what full-mode tau means) and the best fixed number of drafts."""
    if sps is None:
        return summary
    curve = speedup_curve(summary["accept_rate_per_position"], sps)
    best = max(range(len(curve)), key=curve.__getitem__)
    return {**summary, "speedup_full": curve[-1], "speedup_best": curve[best], "best_k": best}


def bench_summary(results, gamma, sps) -> dict:
    """Per category (with speedups), the macro average over categories, and all rounds pooled."""
    categories = {c: with_speedup(v, sps) for c, v in summarize(results, gamma).items()}
    pooled = with_speedup(summarize([{**r, "domain": "all"} for r in results], gamma)["all"], sps)
    return {"categories": categories, "macro_tau": sum(c["tau"] for c in categories.values()) / len(categories),
            "pooled": pooled}


def evaluate(target_dir, draft_dir, benches: dict, calib_records, *, temperatures=(0.0, 1.0),
             calibration_temperatures=(1.0,), max_new_tokens=96, seed=0, sts_objective="ece",
             rounds_out=None, sps=None, weight_format: str = "float32") -> dict:
    """`benches`: name -> prompt records. Per temperature: each bench's categories (tau, rounds,
    acceptance per position, predicted speedups given `sps`), their macro average, the macro over
    benches; at the calibration temperatures STS fitted on `calib_records` and ECE / AUROC on every
    bench's rounds together (prompts the fit never saw)."""
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine

    largest = max([len(r) for r in benches.values()] + [len(calib_records)])
    engine = build_engine(target_dir, draft_dir, config=EngineConfig(mode="full", max_running=largest, seed=seed,
                                                                     max_len=2048), weight_format=weight_format)
    gamma = engine.gamma
    report = {"target": str(target_dir), "draft": str(draft_dir), "gamma": gamma,
              "weight_format": engine.runner.target.weight_format,
              "max_new_tokens": max_new_tokens, "seed": seed, "benches": list(benches), "by_temperature": {}}
    for temp in temperatures:
        first_step = engine.records.total
        entry = {"benches": {}, "domains": {}}
        evals = []
        for name, records in benches.items():
            results = run_split(engine, records, temp, max_new_tokens, name)
            entry["benches"][name] = bench_summary(results, gamma, sps)
            entry["domains"].update(entry["benches"][name]["categories"])
            evals += results
        steps = engine.records.since(first_step)
        entry["macro_tau"] = sum(b["macro_tau"] for b in entry["benches"].values()) / len(benches)
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
            entry["eval_rounds"] = int(len_e.numel())
            entry["calibration"] = calibration_report(conf_e, len_e, temps)
            if rounds_out:  # the raw rounds, for refitting STS offline (benchmarks/sts_calibration.py)
                save_rounds(f"{rounds_out}.t{temp:g}.pt", temp, gamma, {"eval": evals, "calibration": calib})
        report["by_temperature"][f"{temp:g}"] = entry
    return report


def markdown_report(report: dict) -> str:
    """The paper's table form: per bench, a row per category and the macro average, with tau
    (and predicted speedup at full verification when a profile was given) per temperature."""
    temps = list(report["by_temperature"])
    first = report["by_temperature"][temps[0]]
    has_speedup = any("speedup_full" in c for c in first["domains"].values())
    head = [f"tau T={t}" for t in temps]
    if has_speedup:
        head = [x for t in temps for x in (f"tau T={t}", f"speedup T={t}")]
    lines = [f"Drafter `{report['draft']}`, gamma {report['gamma']}, {report['max_new_tokens']} new tokens, "
             "full-block verification" + ("; speedup predicted at one request from the profile's SPS table "
                                          "(verifying all drafts)" if has_speedup else "") + ".", ""]
    for bench in report["benches"]:
        lines += [f"### {bench}", "", "| category | " + " | ".join(head) + " | rounds |",
                  "|---|" + "---|" * (len(head) + 1)]
        categories = list(first["benches"][bench]["categories"])
        for cat in [*categories, "macro"]:
            cells = []
            for t in temps:
                b = report["by_temperature"][t]["benches"][bench]
                c = b["categories"].get(cat)
                cells.append(f"{(c['tau'] if c else b['macro_tau']):.3f}")
                if has_speedup:
                    cells.append(f"{(c or b['pooled'])['speedup_full']:.2f}x")
            rounds = first["benches"][bench]["categories"][cat]["rounds"] if cat != "macro" else ""
            lines.append(f"| {cat} | " + " | ".join(cells) + f" | {rounds} |")
        lines.append("")
    lines.append("Macro over benches: " + ", ".join(
        f"T={t} {report['by_temperature'][t]['macro_tau']:.3f}" for t in temps))
    for t in temps:
        calib = report["by_temperature"][t].get("calibration")
        if calib:
            g = len(calib["ece_after"])
            lines += ["", f"STS at T={t} (fitted on {report['by_temperature'][t]['calibration_rounds']} calibration rounds, "
                      f"measured on {report['by_temperature'][t]['eval_rounds']} bench rounds):", "",
                      "| position | " + " | ".join(str(k + 1) for k in range(g)) + " |", "|---|" + "---|" * g]
            for key, label, scale in (("ece_before", "ECE raw (%)", 100), ("ece_after", "ECE STS (%)", 100),
                                      ("auroc_after", "AUROC", 1)):
                lines.append(f"| {label} | " + " | ".join(f"{scale * x:.2f}" for x in calib[key]) + " |")
    return "\n".join(lines) + "\n"


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


def load_hf_target(target_dir, dtype: torch.dtype = torch.float32):
    """transformers' own model and tokenizer: the reference greedy equality is checked against."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(target_dir)


def greedy_equality(target_dir, draft_dir, num_prompts: int, max_new_tokens: int, *,
                    weight_format: str = "float32", max_running: int | None = None, mode: str = "full",
                    reference: str = "transformers") -> dict:
    """Greedy output of the engine (`mode` full: verify every draft; target: no speculation),
    `max_running` prompts batched (default all), vs a reference on held-out prompts, both in
    `weight_format`: transformers' generate(do_sample=False), one prompt at a time (float32 or
    bfloat16: the formats transformers runs), or (`reference="target"`) our own engine without
    speculation, one request at a time, in any format: what losslessness promises."""
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.engine.cpu.formats import WeightFormat
    from sglang_dspark.prompts import load_prompts

    if reference not in ("transformers", "target"):
        raise ValueError(f"reference {reference!r}: transformers or target")
    if reference == "transformers" and WeightFormat.of(weight_format, row_kernels=False).quantized:
        raise ValueError(f"weight format {weight_format!r}: transformers runs float32 or bfloat16")
    records = load_prompts("builtin:heldout")
    records = [records[i * len(records) // num_prompts] for i in range(num_prompts)]
    engine = build_engine(target_dir, draft_dir, weight_format=weight_format,
                          config=EngineConfig(mode=mode, max_running=max_running or num_prompts, max_len=2048))
    t0 = time.perf_counter()
    results = run_split(engine, records, 0.0, max_new_tokens, "greedy")
    speculative_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if reference == "target":
        plain = build_engine(target_dir, None, weight_format=weight_format,
                             config=EngineConfig(mode="target", max_running=1, max_len=2048))
        refs = [r["tokens"] for r in run_split(plain, records, 0.0, max_new_tokens, "plain")]
    else:
        hf, tokenizer = load_hf_target(target_dir, WeightFormat.of(weight_format, row_kernels=False).dtype)
        refs = []
        for rec in records:
            ids = chat_ids(tokenizer, rec.prompt)
            with torch.no_grad():
                ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                  pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
            refs.append(ref[: ref.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in ref else ref)  # EOS is not emitted
    reference_s = time.perf_counter() - t0
    rows = []
    for i, (rec, res, ref) in enumerate(zip(records, results, refs)):
        first_diff = next((j for j, (a, b) in enumerate(zip(res["tokens"], ref)) if a != b), None)
        equal = res["tokens"] == ref
        tau = (len(res["tokens"]) - 1) / max(len(res["accept_lens"]), 1)
        rows.append({"domain": rec.domain, "tokens": len(ref), "equal": equal, "first_difference": first_diff,
                     "tau": tau})
        print(f"[{i + 1}/{num_prompts}] {rec.domain:>5} tokens={len(ref)} equal={equal} tau={tau:.2f}",
              file=sys.stderr, flush=True)
    return {"target": str(target_dir), "draft": str(draft_dir), "max_new_tokens": max_new_tokens,
            "weight_format": weight_format, "mode": mode, "max_running": max_running or num_prompts,
            "reference": reference, "num_prompts": num_prompts, "all_equal": all(r["equal"] for r in rows),
            "num_equal": sum(r["equal"] for r in rows), "speculative_s": speculative_s, "reference_s": reference_s,
            "prompts": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--draft", required=True, help="drafter checkpoint directory")
    p.add_argument("--bench", "--prompts-file", dest="bench", action="append", default=None,
                   help="a benchmark to evaluate, repeatable: mt-bench, humaneval, builtin:<split>, sharegpt, "
                   f"{HELDOUT_SPEC} or a JSONL file of {{\"domain\", \"prompt\"}} lines, each with an optional :N "
                   "(the first N prompts of each category); tau is reported per category (the records' domain) "
                   "(default: builtin:eval)")
    p.add_argument("--calibration-file", default="builtin:calibration",
                   help="STS calibration prompts, the same kinds of spec; never evaluated on (default: %(default)s)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated sampling temperatures (default: %(default)s)")
    p.add_argument("--calibration-temperatures", default="1",
                   help="temperatures at which STS is fitted and ECE/AUROC reported (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None,
                   help="use only the first N prompts of each category of every split (default: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--dtype", choices=FORMAT_CHOICES, default="float32",
                   help="weight format of target and drafter, as launch --dtype; tau depends on it through the "
                   "target's own distribution (default: %(default)s)")
    p.add_argument("--profile", default=None, help="SLA profile YAML: adds the speedup its SPS table predicts "
                   "at one request from the measured acceptance (default: none)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout (default: Markdown)")
    p.add_argument("--out", help="also write the JSON report to this file")
    p.add_argument("--markdown", help="also write the Markdown tables to this file")
    p.add_argument("--sts-out", help="write the fitted STS temperatures (first calibration temperature) as "
                   "SGLang's DSparkStsCalibration JSON, for `profile capture --sts` and SGLang's "
                   "--speculative-dspark-confidence-sts-path")
    p.add_argument("--sts-objective", choices=OBJECTIVES, default="ece",
                   help="what each STS temperature minimises on the calibration split: the paper's "
                   "cumulative ECE, or the log loss (less prone to fit the noise of a small split) (default: %(default)s)")
    p.add_argument("--rounds-out", help="save every round's raw confidences and accepted length, per split, "
                   "to PREFIX.t<temperature>.pt (for benchmarks/sts_calibration.py)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = args.bench or ["builtin:eval"]
    try:
        benches = {spec: bench_prompts(spec) for spec in specs}
        calib_records = bench_prompts(args.calibration_file) if args.calibration_file else []
        sps = sps_from_profile(args.profile) if args.profile else None
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.limit:
        benches = {k: _per_domain(v, args.limit) for k, v in benches.items()}
        calib_records = _per_domain(calib_records, args.limit)
    temps = tuple(float(t) for t in args.temperatures.split(","))
    report = evaluate(args.target, args.draft, benches, calib_records, temperatures=temps,
                      calibration_temperatures=tuple(float(t) for t in args.calibration_temperatures.split(",")),
                      max_new_tokens=args.max_new_tokens, seed=args.seed,
                      sts_objective=args.sts_objective, rounds_out=args.rounds_out, sps=sps,
                      weight_format=args.dtype)
    report["profile"] = args.profile
    text = json.dumps(report, indent=2)
    markdown = markdown_report(report)
    for path, content in ((args.out, text), (args.markdown, markdown)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
    if args.sts_out:
        sts = sts_from_report(report, dataset=args.calibration_file)
        if sts is None:
            print("error: no STS was fitted (no confidence head, or no calibration temperature among "
                  "--temperatures)", file=sys.stderr)
            return 2
        Path(args.sts_out).parent.mkdir(parents=True, exist_ok=True)
        sts.save(args.sts_out)
    print(text if args.json else markdown)
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

"""python -m sglang_dspark.evaluate --target DIR --draft DRAFT_DIR [--prompts-file F.jsonl] --json

Offline drafter quality: accepted length tau (bonus included) per domain and per position at
temperature 0 and 1 with chain drafting and full-block verification (every draft verified,
lossless rejection sampling), on held-out prompts with the chat template applied; plus
confidence calibration: STS temperatures fitted on the calibration split, cumulative ECE and
AUROC per position before/after on the evaluation split.

Each split is decoded by the reference engine in full-verify mode, all prompts batched (the
engine's target runner matches transformers' logits, tests/test_target_model.py). The greedy-
equality check instead runs `SpeculativeDecoder` (a transformers target with a DynamicCache,
one request at a time) against transformers' own `generate(do_sample=False)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sglang_dspark.core.calibration import OBJECTIVES, calibration_report, fit_sts
from sglang_dspark.core.verify import verify_chain, verify_chain_greedy
from sglang_dspark.drafter import DraftKVCache, greedy_sampler, load_drafter, temperature_sampler


@dataclass
class Generation:
    tokens: list[int]  # emitted tokens (prompt excluded), cut at max_new_tokens / eos
    accept_lens: list[int] = field(default_factory=list)  # accepted drafts per round
    conf_logits: list[torch.Tensor] = field(default_factory=list)  # [G] per round


class SpeculativeDecoder:
    """Chain speculative decoding of one request: drafter block -> one target verify pass."""

    def __init__(self, target, drafter, max_len: int = 4096):
        from transformers import DynamicCache

        self.target = target
        self.drafter = drafter
        self.layer_ids = drafter.config.target_layer_ids
        self.cache_cls = DynamicCache
        self.draft_cache = DraftKVCache(drafter, num_slots=1, max_len=max_len)

    def _target(self, ids: torch.Tensor, cache):
        out = self.target(input_ids=ids[None], past_key_values=cache, use_cache=True,
                          output_hidden_states=True)
        features = torch.cat([out.hidden_states[l + 1][0] for l in self.layer_ids], dim=-1)
        return out.logits[0].float(), features

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 eos_id: int | None = None, generator: torch.Generator | None = None) -> Generation:
        greedy = temperature == 0
        sampler = greedy_sampler if greedy else temperature_sampler(temperature, generator)
        gamma = self.drafter.gamma
        cache = self.cache_cls()
        self.draft_cache.truncate(0, 0)
        gen = Generation(tokens=[])
        logits, features = self._target(torch.tensor(prompt_ids), cache)
        n = len(prompt_ids)
        self.draft_cache.append(0, torch.arange(n), features)
        anchor = int(sampler(logits[-1:], 0)[0])
        gen.tokens.append(anchor)
        pos = n  # sequence position of the anchor (not yet in the target's cache)
        while len(gen.tokens) < max_new_tokens and anchor != eos_id:
            draft = self.drafter.draft(self.draft_cache, [0], torch.tensor([anchor]),
                                       torch.tensor([pos]), sampler=sampler)
            block = torch.cat([torch.tensor([anchor]), draft.tokens[0]])
            logits, features = self._target(block, cache)
            full = torch.tensor([gamma])
            if greedy:
                accepted, nxt = verify_chain_greedy(draft.tokens, logits[None], full)
            else:
                target_probs = torch.softmax(logits / temperature, dim=-1)[None]
                accepted, nxt = verify_chain(draft.tokens, draft.probs, target_probs, full,
                                             generator=generator)
            m = int(accepted[0])
            gen.accept_lens.append(m)
            gen.conf_logits.append(draft.conf_logits[0])
            # Commit the anchor and m drafts; their features become drafter context.
            surplus = cache.get_seq_length() - (pos + 1 + m)
            if surplus:
                cache.crop(-surplus)  # drop the rejected drafts' K/V
            self.draft_cache.append(0, torch.arange(pos, pos + 1 + m), features[: m + 1])
            emitted = draft.tokens[0, :m].tolist() + [int(nxt[0])]
            if eos_id in emitted:
                emitted = emitted[: emitted.index(eos_id) + 1]
            gen.tokens.extend(emitted)
            anchor, pos = emitted[-1], pos + 1 + m
        gen.tokens = gen.tokens[:max_new_tokens]
        return gen


def load_pair(target_dir, draft_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sglang_dspark.train.data import load_target

    target, tokenizer = load_target(target_dir)
    drafter = load_drafter(draft_dir, target.get_input_embeddings(), target.get_output_embeddings())
    return target, tokenizer, drafter


def read_prompts(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_split(engine, tokenizer, records, temperature, max_new_tokens, desc=""):
    """All records decoded together by the engine in full-verify mode (every draft verified,
    lossless rejection sampling, one batched target forward per step).
    Returns per prompt {"domain", "accept_lens", "conf_logits"}, one entry per drafted round."""
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.train.data import chat_prompt_ids

    rounds = defaultdict(list)
    engine.on_round = lambda rid, accepted, verified, conf: rounds[rid].append((accepted, conf.float().clone()))
    ids = [f"{desc}-{i}" for i in range(len(records))]
    engine.generate([chat_prompt_ids(tokenizer, r["prompt"]) for r in records],
                    [SamplingParams(max_tokens=max_new_tokens, temperature=temperature)] * len(records),
                    request_ids=ids, progress=f"{desc} T={temperature:g}")
    engine.on_round = None
    return [{"domain": rec["domain"], "accept_lens": [m for m, _ in rounds[rid]],
             "conf_logits": [c for _, c in rounds[rid]]} for rid, rec in zip(ids, records)]


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
    from sglang_dspark.server.bootstrap import build_reference_engine

    engine = build_reference_engine(str(target_dir), str(draft_dir), None, "full",
                                    max_running=max(len(eval_records), len(calib_records)),
                                    max_len=None, seed=seed)
    tokenizer, gamma = engine.tokenizer, engine.gamma
    report = {"target": str(target_dir), "draft": str(draft_dir), "gamma": gamma,
              "max_new_tokens": max_new_tokens, "seed": seed, "by_temperature": {}}
    for temp in temperatures:
        first_step = len(engine.records)
        evals = run_split(engine, tokenizer, eval_records, temp, max_new_tokens, "eval")
        steps = list(engine.records)[first_step:]
        entry = {"domains": summarize(evals, gamma)}
        taus = [d["tau"] for d in entry["domains"].values()]
        entry["macro_tau"] = sum(taus) / len(taus)
        entry["draft_ms_per_step"] = sum(r["draft_ms"] for r in steps) / max(len(steps), 1)
        entry["target_ms_per_step"] = sum(r["target_verify_ms"] for r in steps) / max(len(steps), 1)
        if engine.drafter.confidence_head is not None and calib_records and temp in calibration_temperatures:
            calib = run_split(engine, tokenizer, calib_records, temp, max_new_tokens, "calib")
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
    """Greedy speculative output vs transformers generate(do_sample=False) on held-out prompts."""
    from sglang_dspark.train.data import chat_prompt_ids
    from sglang_dspark.train.prompts import split_prompts

    target, tokenizer, drafter = load_pair(target_dir, draft_dir)
    decoder = SpeculativeDecoder(target, drafter)
    records = split_prompts("heldout")
    records = [records[i * len(records) // num_prompts] for i in range(num_prompts)]
    rows = []
    for i, rec in enumerate(records):
        ids = chat_prompt_ids(tokenizer, rec["prompt"])
        t0 = time.perf_counter()
        with torch.no_grad():
            ref = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                  pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        t1 = time.perf_counter()
        gen = decoder.generate(ids, max_new_tokens, 0.0, tokenizer.eos_token_id)
        t2 = time.perf_counter()
        first_diff = next((j for j, (a, b) in enumerate(zip(gen.tokens, ref)) if a != b), None)
        equal = gen.tokens == ref
        rows.append({"domain": rec["domain"], "tokens": len(ref), "equal": equal,
                     "first_difference": first_diff, "tau": (len(gen.tokens) - 1) / max(len(gen.accept_lens), 1),
                     "generate_s": t1 - t0, "speculative_s": t2 - t1})
        print(f"[{i + 1}/{num_prompts}] {rec['domain']:>5} tokens={len(ref)} equal={equal} "
              f"tau={rows[-1]['tau']:.2f} hf={t1 - t0:.1f}s spec={t2 - t1:.1f}s", file=sys.stderr, flush=True)
    return {"target": str(target_dir), "draft": str(draft_dir), "max_new_tokens": max_new_tokens,
            "num_prompts": num_prompts, "all_equal": all(r["equal"] for r in rows), "prompts": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--draft", required=True, help="drafter checkpoint directory")
    p.add_argument("--prompts-file", help="evaluation prompts, JSONL lines {\"domain\", \"prompt\"} "
                   "(default: the built-in held-out eval split)")
    p.add_argument("--calibration-file", help="STS calibration prompts, same format "
                   "(default: the built-in held-out calibration split)")
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
    from sglang_dspark.train.prompts import split_prompts

    eval_records = read_prompts(args.prompts_file) if args.prompts_file else split_prompts("eval")
    calib_records = (read_prompts(args.calibration_file) if args.calibration_file
                     else split_prompts("calibration"))
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
        sts = sts_from_report(report, dataset=args.calibration_file or "built-in calibration split")
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
        if seen[r["domain"]] < limit:
            kept.append(r)
            seen[r["domain"]] += 1
    return kept


if __name__ == "__main__":
    sys.exit(main())

"""Does STS lower the drafter's cumulative ECE on held-out prompts, at every position?

Reads the rounds that `python -m sglang_dspark.evaluate --rounds-out PREFIX` saved (raw confidence
logits and accepted lengths of full-verify decoding, per split), then:
  1. chooses the STS objective (ECE, as in the paper, or log loss) by prompt-grouped K-fold
     cross-validation on the calibration split alone, so the eval split plays no part in the choice;
  2. fits both objectives on the whole calibration split, with fit_sts' support rule and without
     it (min_positives 0), and reports cumulative ECE per position on the eval split, before and
     after; for the chosen fit also a bootstrap over eval prompts (rounds of one prompt are
     correlated, so prompts are the unit) of how often "after" beats "before";
  3. gives the ECE a perfectly calibrated predictor would show on the same rounds (labels drawn from
     the calibrated prediction itself): the noise floor that no calibration can go below.

    python benchmarks/sts_calibration.py --rounds runs/rounds.t1.pt [--folds 5] [--min-positives 20] [--bootstrap 1000]
        [--out benchmarks/results/sts_calibration.json] [--plot benchmarks/results/sts_calibration.png]
        [--sts-out launch/models/smollm2-135m-instruct-dspark/sts_calibration.json] [--in-domain]

With --in-domain the calibration split is set aside: STS is fitted on half of the eval split's
prompts and measured on the other half (prompt-disjoint, each domain halved), the case where the
calibration traffic matches the traffic served.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sglang_dspark.core.calibration import (
    OBJECTIVES,
    StsCalibration,
    auroc,
    cumulative_survival,
    ece,
    fit_sts,
    prefix_labels,
)

ROOT = Path(__file__).resolve().parents[1]


def per_position_ece(conf, accept_len, temperatures=None, bins=20):
    labels = prefix_labels(accept_len, conf.shape[1])
    survival = cumulative_survival(conf, temperatures)
    return [ece(survival[:, k], labels[:, k], bins) for k in range(conf.shape[1])]


def per_position_auroc(conf, accept_len, temperatures=None):
    labels = prefix_labels(accept_len, conf.shape[1])
    survival = cumulative_survival(conf, temperatures)
    return [auroc(survival[:, k], labels[:, k]) for k in range(conf.shape[1])]


def select(split, rows):
    mask = torch.isin(split["prompt"], rows)
    return split["conf_logits"][mask], split["accept_len"][mask]


def subset(split, prompts: torch.Tensor) -> dict:
    """The rounds of `prompts` (indices into split["domain"]), prompts renumbered 0..len-1."""
    new_index = torch.full((len(split["domain"]),), -1, dtype=torch.long)
    new_index[prompts] = torch.arange(len(prompts))
    mask = new_index[split["prompt"]] >= 0
    return {"conf_logits": split["conf_logits"][mask], "accept_len": split["accept_len"][mask],
            "prompt": new_index[split["prompt"][mask]], "domain": [split["domain"][int(p)] for p in prompts]}


def halve_by_prompt(split, seed: int) -> tuple[dict, dict]:
    """Two disjoint halves of a split's prompts, each domain split evenly, so both halves see the
    same mix of traffic; a domain's odd prompt goes to the half that is smaller so far."""
    gen = torch.Generator().manual_seed(seed)
    first, second = [], []
    for domain in sorted(set(split["domain"])):
        members = torch.tensor([i for i, d in enumerate(split["domain"]) if d == domain])
        members = members[torch.randperm(len(members), generator=gen)]
        small_first = sum(map(len, first)) <= sum(map(len, second))
        half = (len(members) + small_first) // 2
        first.append(members[:half])
        second.append(members[half:])
    return subset(split, torch.cat(first).sort().values), subset(split, torch.cat(second).sort().values)


def cross_validate(calib, folds: int, seed: int, min_positives: int) -> dict:
    """Mean held-out-fold ECE per position for each objective, folds made of whole prompts."""
    prompts = torch.unique(calib["prompt"])
    order = prompts[torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))]
    parts = [order[i::folds] for i in range(folds)]
    scores = {}
    for objective in OBJECTIVES:
        per_fold = []
        for i, held in enumerate(parts):
            train = torch.cat([p for j, p in enumerate(parts) if j != i])
            temps = fit_sts(*select(calib, train), objective=objective, min_positives=min_positives)
            per_fold.append(per_position_ece(*select(calib, held), temps))
        scores[objective] = torch.tensor(per_fold, dtype=torch.float64).mean(0).tolist()
    return scores


def bootstrap_wins(evals, temps, samples: int, seed: int) -> list[float]:
    """Per position: the share of prompt-bootstrap resamples of the eval split where STS lowers ECE."""
    prompts = torch.unique(evals["prompt"])
    gen = torch.Generator().manual_seed(seed)
    rows_of = {int(p): (evals["prompt"] == p).nonzero().squeeze(-1) for p in prompts}
    wins = torch.zeros(evals["conf_logits"].shape[1])
    for _ in range(samples):
        pick = prompts[torch.randint(len(prompts), (len(prompts),), generator=gen)]
        idx = torch.cat([rows_of[int(p)] for p in pick])
        conf, lens = evals["conf_logits"][idx], evals["accept_len"][idx]
        before, after = per_position_ece(conf, lens), per_position_ece(conf, lens, temps)
        wins += torch.tensor([a < b for a, b in zip(after, before)], dtype=torch.float32)
    return (wins / samples).tolist()


def noise_floor(evals, temps, samples: int, seed: int) -> list[float]:
    """Median ECE of the calibrated prediction against labels drawn from that very prediction."""
    gen = torch.Generator().manual_seed(seed)
    survival = cumulative_survival(evals["conf_logits"], temps)
    conditional = torch.cat([survival[:, :1], survival[:, 1:] / survival[:, :-1].clamp(min=1e-300)], 1)
    floors = []
    for _ in range(samples):
        accepted = torch.rand(conditional.shape, generator=gen, dtype=torch.float64) < conditional
        lens = accepted.to(torch.int64).cumprod(1).sum(1)
        floors.append(per_position_ece(evals["conf_logits"], lens, temps))
    return torch.tensor(floors).median(0).values.tolist()


def affine_bound(calib, evals, min_positives: int) -> dict:
    """What a richer rescaling than STS reaches on this head: sigmoid(z_k / T_k + b_k) per position,
    fitted left to right by log loss on the calibration split like STS (earlier positions frozen, and
    fit_sts' support rule: a position with fewer than `min_positives` accepted or rejected prefixes
    keeps the previous position's map), ECE on the eval split. SGLang's STS file carries temperatures
    only; the bias is one more degree of freedom, so where even this stays above a goal, a better
    temperature will not meet it."""
    def survival(z, params):
        c = torch.stack([torch.sigmoid(z[:, k] / t + b) for k, (t, b) in enumerate(params)], 1)
        return torch.cumprod(c, 1)

    z, labels = calib["conf_logits"].to(torch.float64), prefix_labels(calib["accept_len"], calib["conf_logits"].shape[1])
    params, prefix = [], torch.ones(z.shape[0], dtype=torch.float64)
    for k in range(z.shape[1]):
        positives = int(labels[:, k].sum())
        if min(positives, z.shape[0] - positives) < min_positives:
            params.append(params[-1] if params else (1.0, 0.0))
        else:
            log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)  # T = exp(log_t) > 0
            b = torch.zeros((), dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([log_t, b], max_iter=200, line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                pred = (prefix * torch.sigmoid(z[:, k] / log_t.exp() + b)).clamp(1e-9, 1 - 1e-9)
                loss = torch.nn.functional.binary_cross_entropy(pred, labels[:, k])
                loss.backward()
                return loss

            opt.step(closure)
            params.append((float(log_t.detach().exp()), float(b.detach())))
        t, b = params[-1]
        prefix = prefix * torch.sigmoid(z[:, k] / t + b)  # frozen from here on
    ze, eval_labels = evals["conf_logits"].to(torch.float64), prefix_labels(evals["accept_len"], evals["conf_logits"].shape[1])
    pred = survival(ze, params)
    return {"params": [[round(t, 4), round(b, 4)] for t, b in params],
            "ece_after": [ece(pred[:, k], eval_labels[:, k]) for k in range(ze.shape[1])]}


def plot(path, evals, fits: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = prefix_labels(evals["accept_len"], evals["conf_logits"].shape[1])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharey=True)
    for k, ax in enumerate(axes):
        for name, temps in [("raw", None), *fits.items()]:
            pred = cumulative_survival(evals["conf_logits"], temps)[:, k].contiguous()
            edges = torch.linspace(0, 1, 11, dtype=torch.float64)
            idx = torch.bucketize(pred, edges[1:-1].contiguous())
            xs, ys = [], []
            for b in range(10):
                sel = idx == b
                if int(sel.sum()) >= 20:
                    xs.append(float(pred[sel].mean()))
                    ys.append(float(labels[sel, k].mean()))
            ax.plot(xs, ys, marker="o", label=name if name == "raw" else f"STS ({name})")
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"prefix of {k + 1} accepted")
        ax.set_xlabel("predicted cumulative survival")
    axes[0].set_ylabel("observed rate (eval split)")
    axes[0].legend()
    fig.suptitle("Reliability on held-out eval prompts (bins with >= 20 rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", required=True, help="a PREFIX.t<T>.pt file written by evaluate --rounds-out")
    parser.add_argument("--folds", type=int, default=5,
                        help="prompt-grouped folds for choosing the objective (default: %(default)s)")
    parser.add_argument("--min-positives", type=int, default=20,
                        help="fit_sts' support rule (the unguarded fit, 0, is reported alongside) (default: %(default)s)")
    parser.add_argument("--bootstrap", type=int, default=1000,
                        help="prompt-bootstrap resamples of the eval split (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of folds, bootstrap and noise-floor draws (default: %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/sts_calibration.json"),
                        help="JSON output (default: %(default)s)")
    parser.add_argument("--sts-out", help="write the chosen fit as SGLang's DSparkStsCalibration JSON "
                        "(for `python -m sglang_dspark.profile set-sts`)")
    parser.add_argument("--in-domain", action="store_true",
                        help="ignore the calibration split: fit on a random half of the eval split's prompts "
                        "(each domain halved) and measure on the other half; set against the default run, this "
                        "separates miscalibration from the shift between calibration traffic and eval traffic")
    parser.add_argument("--plot", default=None,
                        help="reliability diagram (positions 1-3); empty to skip (default: --out with .png)")
    args = parser.parse_args()

    if args.in_domain and args.sts_out:
        parser.error("--sts-out with --in-domain: that fit saw half of the eval traffic; ship a fit of the "
                     "calibration split (drop --in-domain)")
    if args.plot is None:
        args.plot = str(Path(args.out).with_suffix(".png"))
    data = torch.load(args.rounds)
    calib, evals = data["calibration"], data["eval"]
    if args.in_domain:  # fit and measure on disjoint halves of the same traffic
        calib, evals = halve_by_prompt(evals, args.seed)
    cv = cross_validate(calib, args.folds, args.seed, args.min_positives)
    chosen = min(OBJECTIVES, key=lambda o: sum(cv[o]))
    before = per_position_ece(evals["conf_logits"], evals["accept_len"])
    gamma = len(before)
    result = {
        "benchmark": "sts_calibration", "rounds_file": args.rounds, "temperature": data["temperature"],
        "splits": "halves of the eval split's prompts" if args.in_domain else "calibration -> eval",
        "calibration": {"rounds": len(calib["accept_len"]), "prompts": len(calib["domain"]),
                        "accepted_prefixes": prefix_labels(calib["accept_len"], gamma).sum(0).tolist()},
        "eval": {"rounds": len(evals["accept_len"]), "prompts": len(evals["domain"]),
                 "accepted_prefixes": prefix_labels(evals["accept_len"], gamma).sum(0).tolist()},
        "cv_ece_by_objective": cv, "chosen_objective": chosen, "min_positives": args.min_positives,
        "ece_before": before, "auroc_before": per_position_auroc(evals["conf_logits"], evals["accept_len"]),
        "fits": [],
    }
    for objective in OBJECTIVES:
        for min_positives in (args.min_positives, 0):
            temps = fit_sts(calib["conf_logits"], calib["accept_len"], objective=objective, min_positives=min_positives)
            after = per_position_ece(evals["conf_logits"], evals["accept_len"], temps)
            fit = {"objective": objective, "min_positives": min_positives, "temperatures": temps.tolist(),
                   "ece_after": after, "lower_at_every_position": all(a < b for a, b in zip(after, before)),
                   "auroc_after": per_position_auroc(evals["conf_logits"], evals["accept_len"], temps)}
            if objective == chosen and min_positives == args.min_positives:  # the shipped choice
                fit["bootstrap_share_lower"] = bootstrap_wins(evals, temps, args.bootstrap, args.seed)
                fit["noise_floor_ece"] = noise_floor(evals, temps, 200, args.seed)
                result["chosen"] = fit
            result["fits"].append(fit)

    print(f"calibration: {result['calibration']['rounds']} rounds / {result['calibration']['prompts']} prompts, "
          f"accepted prefixes per position {[int(x) for x in result['calibration']['accepted_prefixes']]}")
    print(f"eval:        {result['eval']['rounds']} rounds / {result['eval']['prompts']} prompts, "
          f"accepted prefixes per position {[int(x) for x in result['eval']['accepted_prefixes']]}; T={data['temperature']}")
    print("CV on the calibration split, held-out-fold ECE summed over positions: "
          + ", ".join(f"{o} {sum(v):.4f}" for o, v in cv.items()) + f" -> chosen objective: {chosen}")
    print(f"\ncumulative ECE on the eval split, per position (x 1e-3)")
    print(f"{'fit':<22}" + "".join(f"{k + 1:>8}" for k in range(gamma)) + "  lower everywhere")
    print(f"{'raw (no STS)':<22}" + "".join(f"{1e3 * b:>8.3f}" for b in before))
    for fit in result["fits"]:
        name = f"{fit['objective']}, min_pos {fit['min_positives']}"
        print(f"{name:<22}" + "".join(f"{1e3 * a:>8.3f}" for a in fit["ece_after"]) + f"  {fit['lower_at_every_position']}")
    chosen_fit = result["chosen"]
    print(f"{'chosen: P(lower)':<22}" + "".join(f"{p:>8.2f}" for p in chosen_fit["bootstrap_share_lower"])
          + f"  ({args.bootstrap} prompt-bootstrap resamples)")
    print(f"{'noise floor':<22}" + "".join(f"{1e3 * f:>8.3f}" for f in chosen_fit["noise_floor_ece"]))
    result["affine_bound"] = affine_bound(calib, evals, args.min_positives)
    print(f"{'affine (T and bias)':<22}" + "".join(f"{1e3 * a:>8.3f}" for a in result["affine_bound"]["ece_after"])
          + "  (temperature and bias per position: not in SGLang's STS format)")
    print(f"{'AUROC raw':<22}" + "".join(f"{a:>8.3f}" for a in result["auroc_before"]))
    print(f"{'AUROC chosen STS':<22}" + "".join(f"{a:>8.3f}" for a in chosen_fit["auroc_after"]))
    print(f"chosen temperatures: {[round(t, 3) for t in chosen_fit['temperatures']]}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.sts_out:
        StsCalibration(temperatures=chosen_fit["temperatures"], num_samples=result["calibration"]["rounds"],
                       dataset=f"{args.rounds} (calibration split; ECE on its eval split)",
                       ece_before=before, ece_after=chosen_fit["ece_after"]).save(args.sts_out)
    if args.plot:
        plot(args.plot, evals, {chosen: torch.tensor(chosen_fit["temperatures"])})


if __name__ == "__main__":
    main()

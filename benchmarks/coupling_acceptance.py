"""How many drafts each exact verification keeps: rejection sampling against the couplings a seeded
request could be verified by, on simulated distributions at the served vocabulary's size.

    python benchmarks/coupling_acceptance.py [--vocab 49152] [--trials 400] [--temperature 0.8]

Target p = softmax(z / T) with z ~ N(0, 1) * scale; drafter q = softmax((z + N(0, sigma)) / T). Per
(scale, sigma): rejection sampling's acceptance sum(min(p, q)) (exact), inverse-CDF coupling with the
vocabulary in token-id order (what engine/verification.py does for seeded rows: one uniform per
position, shared by draft and target), and Gumbel-max coupling (per-token Gumbel noise shared by both),
each estimated over --trials draws. Prints a table and writes benchmarks/results/coupling_acceptance.json.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import ROOT, write_result


def rates(scale: float, sigma: float, vocab: int, trials: int, temperature: float, rng) -> dict:
    z = rng.standard_normal(vocab) * scale
    p = np.exp((z - z.max()) / temperature)
    p /= p.sum()
    zq = z + rng.standard_normal(vocab) * sigma
    q = np.exp((zq - zq.max()) / temperature)
    q /= q.sum()
    cp, cq = np.cumsum(p), np.cumsum(q)
    u = rng.random(trials)
    inverse = np.mean(np.searchsorted(cp, u * cp[-1], side="right") == np.searchsorted(cq, u * cq[-1], side="right"))
    gumbel_hits = 0
    for _ in range(trials):
        g = -np.log(-np.log(rng.random(vocab)))
        gumbel_hits += int(np.argmax(np.log(p) + g) == np.argmax(np.log(q) + g))
    return {"scale": scale, "sigma": sigma, "rejection": round(float(np.minimum(p, q).sum()), 3),
            "inverse_cdf_id_order": round(float(inverse), 3), "gumbel_max": round(gumbel_hits / trials, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49152, help="vocabulary size (default: SmolLM2's)")
    ap.add_argument("--trials", type=int, default=400, help="draws per case (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="numpy seed (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/coupling_acceptance.json"), help="JSON output path")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = [rates(scale, sigma, args.vocab, args.trials, args.temperature, rng)
            for scale, sigma in ((2, 0.3), (4, 0.3), (4, 1.0), (8, 0.3), (8, 1.0))]
    print("| logit scale | drafter noise | rejection sampling | inverse CDF, id order (seeded rows) | Gumbel-max |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scale']} | {r['sigma']} | {r['rejection']} | {r['inverse_cdf_id_order']} | {r['gumbel_max']} |")
    write_result(args.out, {"vocab": args.vocab, "trials": args.trials, "temperature": args.temperature,
                            "seed": args.seed, "rows": rows})


if __name__ == "__main__":
    main()

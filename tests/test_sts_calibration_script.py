"""benchmarks/sts_calibration.py: the in-domain halves are prompt-disjoint and domain-balanced, and
on rounds whose confidences are miscalibrated by a known temperature the fit lowers ECE."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from sts_calibration import halve_by_prompt  # noqa: E402


def synthetic_split(prompts_per_domain: dict, rounds_per_prompt: int, gamma: int = 3, seed: int = 0,
                    true_temperature: float = 2.0) -> dict:
    """True per-draft acceptance sigmoid(z / T); the logits z claim sigmoid(z): overconfident for T > 1."""
    gen = torch.Generator().manual_seed(seed)
    domains = [d for d, n in prompts_per_domain.items() for _ in range(n)]
    n = len(domains) * rounds_per_prompt
    z = torch.randn(n, gamma, generator=gen, dtype=torch.float64) * 3
    accepted = torch.rand(n, gamma, generator=gen, dtype=torch.float64) < torch.sigmoid(z / true_temperature)
    return {"conf_logits": z, "accept_len": accepted.to(torch.int64).cumprod(1).sum(1),
            "prompt": torch.arange(len(domains)).repeat_interleave(rounds_per_prompt), "domain": domains}


def test_halves_are_disjoint_cover_every_round_and_split_each_domain():
    split = synthetic_split({"chat": 5, "code": 4}, rounds_per_prompt=3)
    first, second = halve_by_prompt(split, seed=1)
    assert sorted(first["domain"]) == ["chat"] * 3 + ["code"] * 2
    assert sorted(second["domain"]) == ["chat"] * 2 + ["code"] * 2
    assert len(first["accept_len"]) + len(second["accept_len"]) == len(split["accept_len"])
    for half in (first, second):  # renumbered prompts index the half's own domain list
        assert half["prompt"].min() == 0 and half["prompt"].max() == len(half["domain"]) - 1
    # every round went with its prompt: the rows of a half are exactly the original rows of its prompts
    rows = {tuple(r.tolist()) for r in split["conf_logits"]}
    assert {tuple(r.tolist()) for r in first["conf_logits"]}.isdisjoint({tuple(r.tolist()) for r in second["conf_logits"]})
    assert {tuple(r.tolist()) for r in torch.cat([first["conf_logits"], second["conf_logits"]])} == rows


def test_odd_domains_do_not_all_favour_one_half():
    # MT-Bench at 5 prompts per category: the odd prompts alternate, the halves differ by at most one
    first, second = halve_by_prompt(synthetic_split({f"cat{i}": 5 for i in range(8)}, rounds_per_prompt=1), seed=0)
    assert {len(first["domain"]), len(second["domain"])} == {20}


def test_an_in_domain_fit_is_never_written_as_the_sts_file(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/sts_calibration.py"), "--rounds", str(tmp_path / "r.pt"),
                           "--in-domain", "--sts-out", str(tmp_path / "sts.json")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--sts-out with --in-domain" in done.stderr
    assert not (tmp_path / "sts.json").exists()


def test_in_domain_run_fits_on_one_half_and_lowers_ece(tmp_path):
    rounds = tmp_path / "rounds.t0.pt"
    # a calibration split of other traffic that must be ignored: here perfectly calibrated
    other = synthetic_split({"other": 10}, rounds_per_prompt=50, seed=2, true_temperature=1.0)
    torch.save({"temperature": 0, "gamma": 3, "calibration": other,
                "eval": synthetic_split({"chat": 20, "code": 20}, rounds_per_prompt=100)}, rounds)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/sts_calibration.py"), "--rounds", str(rounds), "--in-domain",
                    "--bootstrap", "20", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file()  # the plot goes next to --out by default
    assert result["splits"] == "halves of the eval split's prompts"
    assert result["calibration"]["prompts"] == 20 and result["eval"]["prompts"] == 20
    assert result["chosen"]["temperatures"][0] > 1.5  # recovers the overconfidence (T = 2), not the other split's 1
    assert all(a < b for a, b in zip(result["chosen"]["ece_after"], result["ece_before"]))

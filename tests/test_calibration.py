"""STS, ECE and AUROC on synthetic over-confident data with a known ground truth."""

import math

import pytest
import torch

from sglang_dspark.core.calibration import (
    OBJECTIVES,
    StsCalibration,
    apply_sts,
    auroc,
    calibration_report,
    ece,
    fit_sts,
)


def synthetic_overconfident(n=20_000, gamma=7, seed=0, inflate=3.0):
    """True per-position acceptance p = sigmoid(z); the model reports logits inflate * z."""
    g = torch.Generator().manual_seed(seed)
    true_logit = torch.randn(n, gamma, generator=g) * 1.2 + 1.0
    accepted = torch.rand(n, gamma, generator=g) < torch.sigmoid(true_logit)
    accept_len = accepted.to(torch.int64).cumprod(1).sum(1)
    return true_logit * inflate, accept_len


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_sts_at_least_halves_cumulative_ece_at_every_position_and_keeps_ranking(objective):
    fit_logits, fit_len = synthetic_overconfident(seed=0)
    held_logits, held_len = synthetic_overconfident(seed=1)
    temps = fit_sts(fit_logits, fit_len, objective=objective)
    assert bool((temps > 1.0).all()), temps  # over-confident logits get cooled down
    report = calibration_report(held_logits, held_len, temps)
    for before, after in zip(report["ece_before"], report["ece_after"]):
        assert after <= 0.5 * before, report
    # Order-preserving: at every position, the confidences apply_sts calibrates (what the planner
    # ranks) are non-decreasing in the raw confidence logit.
    calibrated = apply_sts(held_logits, temps)
    for k in range(held_logits.shape[1]):
        by_raw = calibrated[torch.argsort(held_logits[:, k]), k]
        assert bool((by_raw[1:] >= by_raw[:-1]).all()), k


def test_sts_log_loss_fit_recovers_the_inflation_and_rejects_unknown_objectives():
    """The log loss is minimised by the true probabilities, so on synthetic data whose logits are
    inflated 3x every fitted temperature lands on the grid point nearest 3."""
    logits, accept_len = synthetic_overconfident(n=40_000, seed=2)
    temps = fit_sts(logits, accept_len, objective="nll")
    assert bool(((temps - 3.0).abs() < 0.35).all()), temps
    with pytest.raises(ValueError, match="objective"):
        fit_sts(logits, accept_len, objective="brier")


def test_sts_positions_without_enough_accepted_prefixes_inherit_the_previous_temperature():
    logits, accept_len = synthetic_overconfident(n=20_000, seed=3)
    accept_len = accept_len.clamp(max=4)  # no prefix of 5 or more is ever accepted
    temps = fit_sts(logits, accept_len)
    assert bool((temps[:4] > 1.0).all()) and bool((temps[4:] == temps[3]).all()), temps
    # Without the rule the empty positions run to an end of the grid (as close to predicting 0 as
    # a temperature gets: here the logits are positive, so the largest T, survival * 1/2).
    unguarded = fit_sts(logits, accept_len, min_positives=0)
    assert bool((unguarded[4:] > 30).all()), unguarded


def test_ece_definition():
    pred = torch.tensor([0.1, 0.1, 0.9, 0.9])
    assert abs(ece(pred, torch.tensor([0, 0, 1, 1])) - 0.1) < 1e-6  # each bin off by 0.1
    assert abs(ece(torch.full((10,), 0.3), torch.tensor([1.0] * 3 + [0.0] * 7))) < 1e-6
    assert abs(ece(torch.tensor([0.25, 0.75]), torch.tensor([1.0, 1.0])) - 0.5) < 1e-6


def test_auroc_matches_pairwise_definition_with_ties():
    g = torch.Generator().manual_seed(3)
    pred = torch.randint(0, 5, (200,), generator=g).double() / 4  # many ties
    label = torch.rand(200, generator=g) < 0.3 + 0.4 * pred
    pos, neg = pred[label], pred[~label]
    diff = pos.unsqueeze(1) - neg.unsqueeze(0)
    expected = float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
    assert abs(auroc(pred, label) - expected) < 1e-6
    assert math.isnan(auroc(pred, torch.ones(200, dtype=torch.bool)))


def test_sts_file_validates_and_round_trips(tmp_path):
    cal = StsCalibration(temperatures=[2.0, 1.5], dataset="d", num_samples=3)
    cal.save(tmp_path / "sts.json")
    assert StsCalibration.load(tmp_path / "sts.json") == cal
    (tmp_path / "bad.json").write_text('{"temperatures": [1.0, -2.0]}')
    try:
        StsCalibration.load(tmp_path / "bad.json")
    except ValueError as err:
        assert "temperatures" in str(err)
    else:
        raise AssertionError("a negative temperature must be refused")

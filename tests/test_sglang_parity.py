"""Differential tests against the pinned sglang==0.5.23: planner budgets, SPS and STS files.

SGLang is always installed by the quickstart; an import failure here means the pinned API moved,
and must fail loudly rather than skip.
"""

import random

import pytest
import torch

from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.core.schedule import decide_budget, plan_verify_lens
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable

pytestmark = pytest.mark.sglang

from sglang.srt.speculative.dspark_components import dspark_sps as up_sps  # noqa: E402
from sglang.srt.speculative.dspark_components import dspark_sts as up_sts  # noqa: E402
from sglang.srt.speculative.dspark_components.dspark_planner import (  # noqa: E402
    DSparkScheduleConfig,
    compute_verify_token_budget,
)


def random_cost_table(rng: random.Random, cover: int) -> SpsTable:
    """A jagged 1-D table: random probes, SPS falling with plateaus and spikes (CUDA-graph steps)."""
    probes = sorted(rng.sample(range(1, cover + 8), rng.randint(1, min(24, cover + 6))))
    sps, level = [], 1.0
    for _ in probes:
        level *= rng.uniform(0.85, 1.02)
        sps.append(level * rng.choice([1.0, 1.0, 0.7, 1.3]))
    return SpsTable.from_points(probes, sps, max_batch_tokens=max(probes[-1], cover + rng.randint(0, 4)))


def random_additive_table(rng: random.Random, cover: int) -> SpsTable:
    bs = sorted(rng.sample(range(1, 300), rng.randint(1, 6)))
    m = sorted(rng.sample(range(1, cover + 20), rng.randint(1, 12)))
    return SpsTable(
        SpsAdditiveCostTable(
            bias_seconds=rng.uniform(1e-3, 2e-2),
            bs_probes=bs,
            alpha_seconds=sorted(rng.uniform(0, 5e-3) for _ in bs),
            m_probes=m,
            theta_seconds=[rng.uniform(0, 3e-2) for _ in m],
        )
    )


def upstream_table(table: SpsTable):
    kind = up_sps.SpsAdditiveCostTable if table.max_batch_tokens is None else up_sps.SpsCostTable
    return kind.from_json(table.to_json())


def random_conf(rng: random.Random, g: torch.Generator) -> torch.Tensor:
    R, G = rng.choice([1, 2, 3, 8, 16, 64]), rng.choice([1, 3, 5, 7])
    conf = torch.rand(R, G, generator=g)
    conf = torch.where(torch.rand(R, G, generator=g) < 0.2, torch.ones_like(conf), conf)  # ties
    conf = torch.where(torch.rand(R, G, generator=g) < 0.05, torch.zeros_like(conf), conf)  # below eps
    return conf


@pytest.mark.parametrize("form", ["cost", "additive"])
def test_budget_equals_upstream_on_random_inputs(form):
    rng, g = random.Random(form), torch.Generator().manual_seed(len(form))
    for _ in range(1000):
        conf = random_conf(rng, g)
        R, G = conf.shape
        cover = R * (G + 1)  # max_batch_tokens never binds, as upstream has no such cap
        table = random_cost_table(rng, cover) if form == "cost" else random_additive_table(rng, cover)
        survival = torch.cumprod(conf, dim=1)
        expected = compute_verify_token_budget(
            history_survival_probs=survival, sps_table=upstream_table(table), cfg=DSparkScheduleConfig(gamma=G)
        )
        ours = decide_budget(survival, table, early_stop=False)
        assert ours.budget == expected.budget
        assert ours.predicted_theta == pytest.approx(expected.predicted_theta, rel=1e-12)
        assert int(plan_verify_lens(conf, table, early_stop=False).sum()) == expected.budget


def test_our_tables_load_in_sglang_with_identical_lookups(tmp_path):
    rng = random.Random(0)
    for i in range(50):
        ours = random_cost_table(rng, 64) if i % 2 else random_additive_table(rng, 64)
        path = tmp_path / f"t{i}.json"
        ours.save(path)
        theirs = up_sps.load_sps_table_from_path(str(path))
        for b in range(0, 80):
            if isinstance(theirs, up_sps.SpsCostTable):
                assert ours(b) == theirs.lookup(b)
            else:
                for r in (1, 7, 200):
                    if b >= r:
                        assert ours(b, num_requests=r) == 1.0 / theirs.step_time(num_reqs=r, budget=b - r)


def test_sglang_tables_load_in_ours_with_identical_lookups(tmp_path):
    theirs = up_sps.profile_sps_table(probes=[(1, 90.0), (4, 80.0), (8, 81.0), (16, 60.0)], max_batch_tokens=64)
    additive = up_sps.SpsAdditiveCostTable(
        bias_seconds=0.004, bs_probes=[1, 16], alpha_seconds=[0.0, 0.002], m_probes=[1, 8, 64], theta_seconds=[0.001, 0.002, 0.01]
    )
    for i, table in enumerate([theirs, additive]):
        path = tmp_path / f"up{i}.json"
        path.write_text(table.to_json())
        ours = SpsTable.load(path)
        assert ours.to_json() == table.to_json()
        for b in range(0, 70):
            if isinstance(table, up_sps.SpsCostTable):
                assert ours(b) == table.lookup(b)
            else:
                assert ours(b, num_requests=1) == 1.0 / table.step_time(num_reqs=1, budget=b - 1)


def test_sts_files_round_trip_between_ours_and_sglang(tmp_path):
    ours = StsCalibration(temperatures=[1.5, 2.0, 0.8], dataset="held-out", num_samples=10, ece_before=[0.1] * 3, ece_after=[0.01] * 3)
    path = tmp_path / "sts.json"
    ours.save(path)
    theirs = up_sts.load_sts_calibration_from_path(str(path))
    assert list(theirs.temperatures) == ours.temperatures and theirs.num_samples == 10
    path.write_text(up_sts.DSparkStsCalibration(temperatures=[3.0, 1.0], dataset="x").to_json())
    back = StsCalibration.load(path)
    assert back.temperatures == [3.0, 1.0] and back.dataset == "x"
    with pytest.raises(ValueError, match="temperatures"):
        StsCalibration(temperatures=[1.0, 0.0])

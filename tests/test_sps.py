"""SPS tables: validation names the bad field, lookups follow SGLang's semantics."""

import pytest

from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable


def test_floor_lookup_clamps_at_both_ends():
    table = SpsTable.from_points([4, 8], [10.0, 5.0], max_batch_tokens=16)
    assert [table(b) for b in (0, 1, 4, 7, 8, 16, 99)] == [10.0, 10.0, 10.0, 10.0, 5.0, 5.0, 5.0]
    assert SpsTable.flat(64).is_flat and not table.is_flat


def test_additive_lookup_interpolates_and_clamps():
    table = SpsTable(SpsAdditiveCostTable(bias_seconds=0.01, bs_probes=[1, 11], alpha_seconds=[0.0, 0.01], m_probes=[2, 4], theta_seconds=[0.0, 0.02]))
    assert table(3, num_requests=1) == pytest.approx(1 / (0.01 + 0.0 + 0.01))
    assert table(100, num_requests=6) == pytest.approx(1 / (0.01 + 0.005 + 0.02))
    assert table(1, num_requests=1) == pytest.approx(1 / 0.01)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(sample_batch_tokens=[], sample_steps_per_sec=[], max_batch_tokens=1), "sample_batch_tokens"),
        (dict(sample_batch_tokens=[2, 1], sample_steps_per_sec=[1.0, 1.0], max_batch_tokens=4), "sample_batch_tokens"),
        (dict(sample_batch_tokens=[1, 2], sample_steps_per_sec=[1.0], max_batch_tokens=4), "sample_steps_per_sec"),
        (dict(sample_batch_tokens=[1, 2], sample_steps_per_sec=[1.0, 0.0], max_batch_tokens=4), "sample_steps_per_sec"),
        (dict(sample_batch_tokens=[1, 8], sample_steps_per_sec=[1.0, 1.0], max_batch_tokens=4), "max_batch_tokens"),
    ],
)
def test_bad_tables_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpsCostTable(**kwargs)


def test_json_round_trip_and_format_detection(tmp_path):
    cost = SpsTable.from_points([1, 2, 5], [3.0, 2.0, 1.0], max_batch_tokens=9)
    additive = SpsTable(SpsAdditiveCostTable(bias_seconds=0.1, bs_probes=[1], alpha_seconds=[0.0], m_probes=[1, 3], theta_seconds=[0.1, 0.2]))
    for table in (cost, additive):
        table.save(tmp_path / "t.json")
        again = SpsTable.load(tmp_path / "t.json")
        assert type(again.table) is type(table.table) and again.to_json() == table.to_json()

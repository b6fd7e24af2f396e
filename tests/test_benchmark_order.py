"""The benchmarks' arm order: every arm follows every other arm equally often (carry-over balance)."""

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import balanced_order  # noqa: E402


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_each_arm_runs_right_after_every_other_equally_often(n):
    arms = [f"arm{i}" for i in range(n)]
    period = n if n % 2 == 0 else 2 * n
    orders = [balanced_order(arms, r) for r in range(period)]
    assert all(sorted(o) == arms for o in orders)  # each repeat runs every arm once
    pairs = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    assert set(pairs) == {(a, b) for a in arms for b in arms if a != b}
    assert len(set(pairs.values())) == 1
    assert balanced_order(arms, period) == orders[0]


def test_a_plain_rotation_is_not_balanced():
    # why the design: rotating [t, f, d, s] always puts d right after f
    arms = ["t", "f", "d", "s"]
    rotated = [arms[r:] + arms[:r] for r in range(4)]
    assert sum(("f", "d") in zip(o, o[1:]) for o in rotated) == 3
    assert sum(("f", "d") in zip(o, o[1:]) for o in (balanced_order(arms, r) for r in range(4))) == 1

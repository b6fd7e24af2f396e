"""bfloat16's one-row kernel (engine/cpu/one_row_gemv.py): a single row goes through the kernel that gives
it the bits it gets inside a multi-row verify block (batch invariance), and where both F.linear and
mv do, through the one a timer said is faster; every other row count stays on F.linear. The timer is
injected and kernels that break invariance are simulated, so nothing depends on this host."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dspark.engine.cpu import one_row_gemv
from sglang_dspark.engine.cpu.one_row_gemv import OneRowGemvLinear, pack_one_row_gemv, tune_one_row_kernels


def bf16_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False),
                         nn.Linear(16, 24, bias=True), nn.Linear(16, 8)).to(torch.bfloat16)


def test_pack_changes_only_cpu_bfloat16_linears_and_keeps_outputs():
    model = bf16_model()
    model[3] = nn.Linear(16, 8)  # float32: not a bfloat16 layer
    before = [m(torch.ones(1, 16, dtype=m.weight.dtype)) for m in model]
    assert pack_one_row_gemv(model) == 3
    assert pack_one_row_gemv(model) == 0  # idempotent
    assert [type(m) is OneRowGemvLinear for m in model] == [True, True, True, False]
    assert all(not m.gemv for m in model[:3])  # off until tuned
    for m, y in zip(model, before):
        assert torch.equal(m(torch.ones(1, 16, dtype=m.weight.dtype)), y)


def test_mv_serves_one_row_exactly_where_it_timed_faster_and_matched_bits(monkeypatch):
    model = bf16_model()
    pack_one_row_gemv(model)
    monkeypatch.setattr(one_row_gemv, "_invariant_kernels", lambda layer: {False: True, True: True})  # both keep the bits: speed decides
    calls = []

    def timer(linears, x, gemv):
        calls.append((linears[0].out_features, gemv))
        faster = linears[0].out_features in (16, 8) and gemv  # mv wins for 16x16 and 8x16, not 24x16
        return 1.0 if faster else 2.0

    chosen = tune_one_row_kernels([model], reps=3, timer=timer)
    assert chosen == {(16, 16): True, (24, 16): False, (8, 16): True}
    assert [m.gemv for m in model] == [True, True, False, True]
    assert len(calls) == 3 * 2 * 4  # each shape once for its layers: 3 shapes x 2 kernels x (1 + 3)

    seen = []
    real_mv, real_addmv = torch.mv, torch.addmv
    monkeypatch.setattr(one_row_gemv.torch, "mv", lambda w, x: seen.append(tuple(w.shape)) or real_mv(w, x))
    monkeypatch.setattr(one_row_gemv.torch, "addmv", lambda b, w, x: seen.append(tuple(w.shape)) or real_addmv(b, w, x))
    for rows in (1, 2, 5):
        x = torch.randn(rows, 16).to(torch.bfloat16)
        for m in model:
            torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias))
        assert seen == ([(16, 16), (16, 16), (8, 16)] if rows == 1 else []), rows
        seen.clear()
    x = torch.randn(1, 1, 16).to(torch.bfloat16)  # one row with a leading batch dimension
    assert model[0](x).shape == (1, 1, 16) and seen == [(16, 16)]


def test_mv_is_not_used_where_it_breaks_batch_invariance_even_when_faster(monkeypatch):
    model = bf16_model()
    pack_one_row_gemv(model)
    monkeypatch.setattr(one_row_gemv, "one_row", lambda x, w, b: F.linear(x[None], w, b)[0] + 1)  # a kernel that is off
    chosen = tune_one_row_kernels([model], reps=1, timer=lambda linears, x, gemv: 1.0 if gemv else 2.0)
    assert not any(chosen.values()) and not any(m.gemv for m in model)


def _one_row_linear_off_by_a_bit(monkeypatch):
    """F.linear as a CPU whose one-row path rounds differently from its multi-row path."""
    real = F.linear

    def linear(x, w, b=None):
        y = real(x, w, b)
        return y + torch.finfo(y.dtype).eps * y.abs() if x.dim() == 2 and x.shape[0] == 1 else y
    monkeypatch.setattr(one_row_gemv.F, "linear", linear)


def test_mv_serves_one_row_where_only_it_keeps_batch_invariance_even_when_slower(monkeypatch):
    model = bf16_model()
    pack_one_row_gemv(model)
    _one_row_linear_off_by_a_bit(monkeypatch)
    assert one_row_gemv._invariant_kernels(model[0]) == {False: False, True: True}
    chosen = tune_one_row_kernels([model], reps=1, timer=lambda linears, x, gemv: 2.0 if gemv else 1.0)
    assert all(chosen.values()) and all(m.gemv for m in model)


def test_where_no_one_row_kernel_keeps_invariance_the_faster_serves_and_a_warning_says_so(monkeypatch, caplog):
    model = bf16_model()
    pack_one_row_gemv(model)
    _one_row_linear_off_by_a_bit(monkeypatch)
    monkeypatch.setattr(one_row_gemv, "one_row", lambda x, w, b: F.linear(x[None], w, b)[0])  # mv off the same way
    with caplog.at_level("WARNING", logger=one_row_gemv.__name__):
        chosen = tune_one_row_kernels([model], reps=1, timer=lambda linears, x, gemv: 1.0 if gemv else 2.0)
    assert all(chosen.values())
    assert sum("no one-row kernel gives the bits" in r.message for r in caplog.records) == len(chosen)

"""benchmarks/draft_cost.py: its probes time every part and kernel of a draft without changing what the
draft computes, and come off whole; its shape names parse to the configs they say."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from sglang_dspark.drafter import argmax_sampler
from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.cpu.draft_rows import DraftRows
from tests.test_draft_rows import CONTEXT, _drafter, _filled_caches

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from draft_cost import instrument, shape_config  # noqa: E402

needs_kernels = pytest.mark.skipif(cpu_rows.ops() is None, reason=f"row kernels unavailable: {cpu_rows.status()}")


@needs_kernels
def test_probed_draft_equals_the_plain_one_and_every_part_is_timed():
    drafter = _drafter()
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    plain, probed = _filled_caches(drafter)
    anchors, anchor_pos = torch.tensor([5, 7, 9]), torch.tensor(CONTEXT)
    want = drafter.draft(plain, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler)
    sink = defaultdict(float)
    remove = instrument(drafter, sink)
    got = drafter.draft(probed, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler)
    remove()
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.conf_logits, want.conf_logits)
    for part in ("part flush", "part layers", "part lm_head part", "part markov", "part confidence",
                 "gemm fc", "gemm qkv", "gemm gate_up", "gemm lm_head", "rows_attention", "markov_argmax_chain"):
        assert sink[part] > 0, part
    # the probes are off: the backend's methods and weights are its own again
    assert "block_hidden" not in vars(drafter.rows) and type(drafter.rows.fc).__name__ != "Probe"
    assert all(type(layer.rows.qkv).__name__ != "Probe" for layer in drafter.rows.layers)
    assert type(drafter.rows.ops).__name__ != "ProbedOps"


def test_shape_names():
    drafter = _drafter()
    config, vocab = shape_config(drafter.config, "g3-l2-v2048-gated")
    assert (config.block_size, config.num_hidden_layers, config.markov_head_type, vocab) == (3, 2, "gated", 2048)
    assert shape_config(drafter.config, "shipped") == (drafter.config, None)
    with pytest.raises(SystemExit, match="'x3'"):
        shape_config(drafter.config, "g3-x3")

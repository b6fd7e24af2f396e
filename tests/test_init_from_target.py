"""--init target-last-layer: the drafter's context keys and values start as the target's own
last-layer keys and values of the same positions, and its MLP and final norm as the target's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drafter_fixtures import tiny_drafter, write_tiny_model_dirs
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.train.init_from_target import init_from_target_last_layer


def test_context_kv_mlp_and_norm_start_as_the_targets_last_layer(tmp_path):
    target_dir, _ = write_tiny_model_dirs(tmp_path)
    target = TargetModel.from_pretrained(target_dir)
    drafter = tiny_drafter(target_layer_ids=[0, 2])  # 4 target layers: layer 2 is the last one's input
    assert "fc reads layer 2" in init_from_target_last_layer(drafter, target)
    last, cfg = target.layers[-1], drafter.config
    torch.manual_seed(1)
    layer0, layer2 = torch.randn(5, 32), 3 * torch.randn(5, 32)
    with torch.no_grad():
        ctx = drafter.hidden_norm(drafter.fc(torch.cat([layer0, layer2], -1)))
        torch.testing.assert_close(ctx, last.attn_norm(layer2))
        qkv = last.qkv_proj(last.attn_norm(layer2))
        q_end, k_end = cfg.num_attention_heads * cfg.head_dim, (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim
        for layer in drafter.layers:
            torch.testing.assert_close(layer.self_attn.k_proj(ctx), qkv[:, q_end:k_end])
            torch.testing.assert_close(layer.self_attn.v_proj(ctx), qkv[:, k_end:])
            torch.testing.assert_close(layer.self_attn.q_proj(ctx), qkv[:, :q_end])
            y = torch.randn(5, 32)
            gate, up = last.gate_up_proj(y).chunk(2, dim=-1)
            torch.testing.assert_close(layer.mlp(y), last.down_proj(F.silu(gate) * up))
        torch.testing.assert_close(drafter.norm.weight, target.norm.weight.float())

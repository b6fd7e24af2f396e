"""Start a drafter from the target's last decoder layer instead of random weights.

The drafter's layer has the target layer's shape, and the context it attends to is
`hidden_norm(fc([H^l1; ...]))`. With fc reading the stored output of the layer before the last as
is (the last layer's input) and hidden_norm carrying the last layer's input norm, the draft layer's
keys and values over the context start as the target's own last-layer keys and values: the state
the target decodes from, rather than noise the drafter must first learn to read. The final norm is
the target's, the scale its (shared) lm_head was trained on. The drafter's q/k norms (Qwen3-style,
which a Llama-style target lacks) stay at 1; other fc columns start at 0 and train from there.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def init_from_target_last_layer(drafter, target) -> str:
    """Copy the target's last layer into every draft layer; returns what was done, for the log."""
    last, cfg = target.layers[-1], drafter.config
    if last.qkv_proj.bias is not None or last.o_proj.bias is not None or last.gate_up_proj.bias is not None:
        raise ValueError("--init target-last-layer: the target's last layer has biases the drafter's layer lacks")
    h, hd = cfg.hidden_size, cfg.head_dim
    q, k, v = last.qkv_proj.weight.float().split([cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd,
                                                  cfg.num_key_value_heads * hd])
    gate, up = last.gate_up_proj.weight.float().chunk(2)
    for layer in drafter.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for dst, src in ((layer.input_layernorm.weight, last.attn_norm.weight), (attn.q_proj.weight, q),
                         (attn.k_proj.weight, k), (attn.v_proj.weight, v), (attn.o_proj.weight, last.o_proj.weight),
                         (layer.post_attention_layernorm.weight, last.mlp_norm.weight), (mlp.gate_proj.weight, gate),
                         (mlp.up_proj.weight, up), (mlp.down_proj.weight, last.down_proj.weight)):
            dst.copy_(src.float())
    drafter.norm.weight.copy_(target.norm.weight.float())
    before_last = cfg.num_target_layers - 2
    if before_last not in cfg.target_layer_ids:
        return "draft layers and final norm from the target's last layer (fc random: layer " \
               f"{before_last} is not among target_layer_ids)"
    slot = cfg.target_layer_ids.index(before_last)
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, slot * h:(slot + 1) * h] = torch.eye(h)
    drafter.hidden_norm.weight.copy_(last.attn_norm.weight.float())
    return f"draft layers, final norm and the context path from the target's last layer (fc reads layer {before_last})"

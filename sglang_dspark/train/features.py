"""Teacher-forced target features: each sequence through the engine's target, its prompt as one
prefill and its response's positions as one continuation after it.

The engine's own `TargetModel` runs the passes with the engine's Linear paths (the prompt through
int4's prefill copy, the response through the decode kernels), so training sees the layer outputs
the engine hands the drafter at inference up to attention's rounding (the engine attends each
decode row alone; here the response's rows attend in one masked call). The last decoder layer is always captured: the final normed
hidden state is `final_hidden(last layer output)`, and from it the target's distribution over
any set of tokens is recovered with the lm_head rows of those tokens and the stored log-normaliser.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_dspark.engine.target_model import Segment, TargetModel

LOGIT_ROWS = 512  # positions per full-vocabulary matmul (bounds the [rows, V] logits in memory)


def final_hidden(last_layer: torch.Tensor, norm: dict) -> torch.Tensor:
    """The target's final normed hidden state from its last decoder layer's output (any dtype in,
    float32 out). Extraction and training both call this, so their logits agree exactly."""
    h = last_layer.float()
    return F.rms_norm(h, (h.shape[-1],), norm["weight"].float(), norm["eps"])


def final_norm_of(target: TargetModel) -> dict:
    return {"weight": target.norm.weight.detach().float().clone(), "eps": float(target.norm.eps)}


def capture_layers(layer_ids, num_layers: int) -> tuple[int, ...]:
    """The stored layers: the requested ones plus the last (it gives the final hidden state)."""
    return tuple(sorted(set(int(i) for i in layer_ids) | {num_layers - 1}))


@torch.inference_mode()
def target_statistics(last_layer: torch.Tensor, norm: dict, lm_head: torch.Tensor, mass_from: int = 0):
    """(lse [T], argmax [T], probability mass per token id [V] summed over rows >= mass_from) of
    the target's next-token distributions, from the fp16-stored last-layer output, exactly as
    training recomputes them."""
    lse, argmax = [], []
    mass = torch.zeros(lm_head.shape[0], dtype=torch.float64)
    for start in range(0, last_layer.shape[0], LOGIT_ROWS):
        logits = final_hidden(last_layer[start : start + LOGIT_ROWS].half(), norm) @ lm_head.T.float()
        row_lse = torch.logsumexp(logits, dim=-1)
        lse.append(row_lse)
        argmax.append(logits.argmax(-1))
        skip = max(mass_from - start, 0)
        mass += torch.exp(logits[skip:] - row_lse[skip:, None]).sum(0, dtype=torch.float64)
    return torch.cat(lse), torch.cat(argmax), mass


def _hidden(target: TargetModel, cache, layers, segments: list[Segment], *, prefill: bool) -> torch.Tensor:
    """The captured layers' outputs of the non-empty segments, in order ([0, ...] when all are empty)."""
    segments = [s for s in segments if len(s.tokens)]
    if not segments:
        return torch.zeros(0, len(layers) * target.config.hidden_size, dtype=target.dtype)
    return target.forward_segments(segments, cache, capture_layers=layers, logits_for="last", prompt=prefill).hidden


@torch.inference_mode()
def teacher_forced_rows(target: TargetModel, sequences: list[tuple[list[int], int]], layer_ids,
                        *, max_batch_tokens: int = 4096) -> list[dict]:
    """Per (token ids, prompt length): the stored layers' outputs [n - 1, L * H] (fp16), lse and
    argmax at positions 0..n-2, and the probability mass over the response positions.

    Sequences run in ragged batches of about `max_batch_tokens`, longest first, so padding is small."""
    layers = capture_layers(layer_ids, target.config.num_hidden_layers)
    hidden = target.config.hidden_size
    norm = final_norm_of(target)
    lm_head = target.lm_head_weight().detach()  # real numbers in every weight format (int8 included)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    longest = max((len(s) for s, _ in sequences), default=1)
    rows: list[dict | None] = [None] * len(sequences)
    batches, current, tokens = [], [], 0
    for i in order:
        n = len(sequences[i][0])
        if current and tokens + n > max_batch_tokens:
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    cache = target.new_kv_cache(max(len(b) for b in batches) if batches else 1, longest)
    for batch in batches:
        # with the engine's Linear paths: the prompt prefilled (int4: through its bfloat16 copy,
        # engine/cpu/quantized_linear.py), the response's positions after it through the decode kernels
        split = [min(sequences[i][1], len(sequences[i][0]) - 1) for i in batch]
        first = _hidden(target, cache, layers, [Segment(slot, 0, torch.tensor(sequences[i][0][:p]))
                                                for slot, (i, p) in enumerate(zip(batch, split))], prefill=True)
        second = _hidden(target, cache, layers, [Segment(slot, p, torch.tensor(sequences[i][0][p:-1]))
                                                 for slot, (i, p) in enumerate(zip(batch, split))], prefill=False)
        # each sequence's rows: its p prompt positions, then its n - 1 - p response positions
        prompt_rows = first.split(split)
        response_rows = second.split([len(sequences[i][0]) - 1 - p for i, p in zip(batch, split)])
        for i, head, tail in zip(batch, prompt_rows, response_rows):
            feats = torch.cat([head, tail]).half()
            prompt_len = sequences[i][1]
            # mass over response positions only: position t predicts token t + 1
            lse, argmax, mass = target_statistics(feats[:, -hidden:], norm, lm_head, mass_from=prompt_len - 1)
            rows[i] = {"tokens": sequences[i][0], "prompt_len": prompt_len, "features": feats.clone(),
                       "lse": lse, "argmax": argmax, "mass": mass}
    return rows

"""Target model runner for the llama / qwen2 / qwen3 families over a per-slot KV cache.

One `forward_segments` call runs a ragged batch: chunked prefill, decode and speculative verify of
many requests together. Linear layers run once on the packed [T, d] tokens; attention is one SDPA
call per layer over the segments padded to the longest new-token count and context, except for one
request's decode and verify rows, which are computed batch-invariantly (_one_request_attention).
Where the weight format sets `row_kernels` (int8 and int4 where the package's CPU kernels run,
engine/cpu/formats.py), a layer runs as engine/cpu/row_layer.py's nine row-kernel calls (the
drafter's block makes the same), and a call whose segments all have at most EXACT_ROWS tokens (decode
rows, verify blocks of gamma <= 15, short chunks) takes the row kernels' attention: one call per
layer for all rows of all requests, each row over exactly the keys it sees, so no row depends on
what shares its step (engine/cpu/cpu_rows.cpp); a longer segment sends the call to the masked SDPA
path. Prompt chunks call each Linear layer's prompt path (`prompt=True`: int4's bfloat16 copy).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from sglang_dspark.engine.cpu.formats import WeightFormat, model_dtype
from sglang_dspark.engine.cpu.limits import EXACT_ROWS
from sglang_dspark.engine.cpu.row_layer import attend_rows, call, forward_rows, prompt_call
from sglang_dspark.engine.kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Positions past the model's context that a draft block may occupy: a request at the context's end
# still verifies one block beyond it (those drafts are cut by max_tokens, never emitted).
ROPE_HEADROOM = 64
# rope types whose frequencies do not depend on the sequence length, so one table serves every call
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class Segment:
    """One request's new tokens in a ragged batch."""

    slot: int  # KV cache slot
    start: int  # absolute position of tokens[0]; the slot's cache holds valid K/V for positions < start
    tokens: torch.Tensor  # int64 [n]


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # float32 [T, V] in segment order, or [R, V] (each segment's last token) for logits_for="last"
    hidden: torch.Tensor | None  # [T, len(capture_layers) * hidden]: outputs of the captured decoder layers


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_tables(config, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_positions, head_dim] in float32, the half-rotation layout HF uses."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported by the reference runner")
    if rope_type == "default":
        dim = _head_dim(config)
        inv_freq = 1.0 / params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        scale = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config)
    pos = torch.arange(length, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


def _rope_rotation(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, sign) with rotate_half(x) == x[..., index] * sign: one gather in place of a chunk, a
    negation and a concatenation (fewer ops per layer; a step of a small model is dispatch-bound)."""
    half = head_dim // 2
    index = torch.cat((torch.arange(half, head_dim), torch.arange(half)))
    sign = torch.cat((-torch.ones(half), torch.ones(half)))
    return index, sign


def _apply_rope_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` (x [T, heads, head_dim], tables [T, 1,
    head_dim]) with the rotation's sign folded into the sine table (signed_sin = sign * sin):
    (-a) * s and a * (-s) round alike, so the result is transformers' bit for bit in any dtype."""
    return x * cos + x.index_select(-1, index) * signed_sin


class RMSNorm(nn.RMSNorm):
    """RMSNorm with transformers' rounding: normalised in float32, cast to the activation dtype, then
    scaled by the weight in that dtype (torch's fused op scales before casting, so bfloat16 outputs
    would differ from transformers' in the last bit)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x.float(), self.normalized_shape, eps=self.eps).to(x.dtype)


# One request's decode and verify rows (a segment of up to EXACT_ROWS after a cached prefix) take
# the batch-invariant attention (_one_request_attention); longer segments (prompt chunks after a
# cached prefix) take the batched, masked kernel.


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, hd = config.hidden_size, _head_dim(config)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        attn_bias = getattr(config, "attention_bias", False)
        qkv_bias = attn_bias or config.model_type == "qwen2"  # qwen2 always has q/k/v bias, never o bias
        mlp_bias = getattr(config, "mlp_bias", False)
        self.attn_norm = RMSNorm(d, eps=config.rms_norm_eps)
        # fused projections: one GEMM instead of three (q/k/v) and two (gate/up)
        self.qkv_proj = nn.Linear(d, (self.num_heads + 2 * self.num_kv_heads) * hd, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=attn_bias and config.model_type != "qwen2")
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, eps=config.rms_norm_eps)
        self.mlp_norm = RMSNorm(d, eps=config.rms_norm_eps)
        self.gate_up_proj = nn.Linear(d, 2 * config.intermediate_size, bias=mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, d, bias=mlp_bias)

    # set by the weight format where the row kernels serve the model (engine/cpu/row_layer.py)
    row_weights = None

    def forward(self, x: torch.Tensor, layer_kv: torch.Tensor, b: "_Batch") -> torch.Tensor:
        if b.kernels is not None:
            return forward_rows(b.kernels, self.row_weights, x, layer_kv, b.rope_cos, b.rope_sin, b.positions,
                                b.token_slots, lambda q: self._attention(q, layer_kv, b), b.linear)
        T, H, KVH, hd = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = b.linear(self.qkv_proj, self.attn_norm(x))
        v = qkv[:, (H + KVH) * hd :].view(T, KVH, hd)
        if self.qk_norm:
            q, k = qkv[:, : H * hd].view(T, H, hd), qkv[:, H * hd : (H + KVH) * hd].view(T, KVH, hd)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        else:
            qk = qkv[:, : (H + KVH) * hd].view(T, H + KVH, hd)
        # one rotation for q and k together: their heads are adjacent in the fused projection
        qk = _apply_rope_signed(qk, b.cos, b.signed_sin, b.rotate_index)
        q, k = qk[:, :H], qk[:, H:]
        # layer_kv [2, slots, KVH, max_len, hd]; split advanced indices put T first: [T, 2, KVH, hd]
        layer_kv[:, b.token_slots, :, b.positions] = torch.stack((k, v), dim=1)
        x = x + b.linear(self.o_proj, self._attention(q, layer_kv, b))
        gate, up = b.linear(self.gate_up_proj, self.mlp_norm(x)).chunk(2, dim=-1)
        return x + b.linear(self.down_proj, F.silu(gate) * up)

    def _attention(self, q: torch.Tensor, layer_kv: torch.Tensor, b: "_Batch") -> torch.Tensor:
        H, KVH, hd = self.num_heads, self.num_kv_heads, self.head_dim
        if b.row_keys is not None:
            return attend_rows(b.kernels, q, layer_kv, b.token_slots, b.row_keys, hd ** -0.5)
        R, N, G = b.num_segments, b.max_new, H // KVH
        if R == 1 and b.mask is None:  # _batch builds no mask where one request's rows go one by one
            return self._one_request_attention(q, layer_kv, b)
        if b.pad_rows is not None:
            q = q.new_zeros(R * N, H, hd).index_copy_(0, b.pad_rows, q)
        # GQA without repeating K/V: fold each kv head's G query heads into the query axis
        q = q.view(R, N, KVH, G, hd).transpose(1, 2).reshape(R, KVH, N * G, hd)
        kv = layer_kv[:, b.slot_slice, :, : b.max_ctx] if b.slot_slice is not None else layer_kv[:, b.slots, :, : b.max_ctx]
        o = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=b.mask)
        o = o.view(R, KVH, N, G, hd).transpose(1, 2).reshape(R * N, H * hd)
        return o if b.pad_rows is None else o.index_select(0, b.pad_rows)

    def _one_request_attention(self, q: torch.Tensor, layer_kv: torch.Tensor, b: "_Batch") -> torch.Tensor:
        """One request's rows. A prompt from position 0: SDPA as transformers calls it (is_causal).
        A decode or verify block: batch-invariant, so speculative output equals non-speculative
        output token for token in any format. The CPU kernels round a row differently when it is
        computed among others: SDPA's flash kernel with the rows it is blocked with, the key count,
        a mask, and (rows as batch elements) how its work splits over the threads; a GEMM with the
        number of rows. bfloat16 greedy outputs diverged at near-ties. So each row is one SDPA call
        of its own, the call its decode would make: its kv head's G query heads as query rows (GQA
        folded: much faster than heads as heads; benchmarks/attention_row_batching.py), over exactly the keys it sees."""
        H, KVH, hd, N = self.num_heads, self.num_kv_heads, self.head_dim, b.max_new
        kv = layer_kv[:, b.slot_slice.start, :, : b.max_ctx]  # an int index: a view, not a gather copy
        if b.causal:
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kv[0][None], kv[1][None],
                                               is_causal=True, enable_gqa=True)
            return o[0].transpose(0, 1).reshape(N, H * hd)
        first = b.max_ctx - N + 1  # keys the first row sees (all, for a decode): the segment ends the context
        rows = [F.scaled_dot_product_attention(q[i].view(1, KVH, H // KVH, hd), kv[0][None, :, : first + i],
                                               kv[1][None, :, : first + i]) for i in range(N)]
        return torch.cat(rows).reshape(N, H * hd)


@dataclass
class _Batch:
    """Per-call metadata shared by every layer, built once with tensor ops (no per-token Python)."""

    num_segments: int
    max_new: int
    max_ctx: int
    positions: torch.Tensor  # [T] absolute positions
    token_slots: torch.Tensor  # [T] cache slot of each token
    slots: torch.Tensor  # [R]
    slot_slice: slice | None  # the slots as a view when they are consecutive (no gather copy)
    pad_rows: torch.Tensor | None  # [T] row of each token in the padded [R * max_new] layout; None if no padding
    last_rows: torch.Tensor  # [R] packed row of each segment's last token
    mask: torch.Tensor | None  # bool [R, 1, max_new * G, max_ctx]; None for one request (R = 1) but a long chunk
    causal: bool  # one segment from position 0: the mask is plain causal (SDPA's is_causal)
    cos: torch.Tensor  # [T, 1, head_dim]
    signed_sin: torch.Tensor  # [T, 1, head_dim]: sin with rotate_half's sign folded in (_rope_rotation)
    rotate_index: torch.Tensor  # [head_dim]
    kernels: object = None  # TargetModel.row_kernels
    row_keys: torch.Tensor | None = None  # [T] keys each row sees (its position + 1) where rows_attention serves
    rope_cos: torch.Tensor | None = None  # the model's tables (in its dtype), for rows_rope_store
    rope_sin: torch.Tensor | None = None
    linear: object = call  # how a Linear layer takes these rows (row_layer.call, or prompt_call for a prompt chunk)


class TargetModel(nn.Module):
    # set by the weight format (engine/cpu/formats.py): torch.ops of engine/cpu/cpu_rows.py, or None
    row_kernels = None
    fmt: WeightFormat  # the format it was prepared in

    def __init__(self, config):
        super().__init__()
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {config.model_type!r} is not supported (llama, qwen2, qwen3)")
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            raise ValueError("sliding-window attention is not supported by the reference runner")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        with torch.device("cpu"):  # stays real when the module is built under torch.device("meta")
            cos, sin = _rope_tables(config, config.max_position_embeddings + ROPE_HEADROOM)
            index, sign = _rope_rotation(cos.shape[-1])
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("rope_index", index, persistent=False)
        self.register_buffer("rope_sign", sign, persistent=False)

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, *, weight_format: "str | WeightFormat" = "float32", device="cpu") -> "TargetModel":
        """Load a HF safetensors model directory (config.json + *.safetensors) in `weight_format`
        (engine/cpu/formats.py)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        state = {}
        for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            state.update(load_file(file))
        if not state:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        return cls._from_hf_state_dict(config, state, weight_format, device)

    @classmethod
    def from_hf_model(cls, hf_model, weight_format: "str | WeightFormat | None" = None) -> "TargetModel":
        """Build from an in-memory transformers *ForCausalLM (weights copied into fused layout); the
        format defaults to the one the HF model runs in (float32 or bfloat16)."""
        p = next(hf_model.parameters())
        weight_format = weight_format or WeightFormat.running_in(p.dtype)
        return cls._from_hf_state_dict(hf_model.config, hf_model.state_dict(), weight_format, p.device)

    @classmethod
    def _from_hf_state_dict(cls, config, hf: dict, weight_format: "str | WeightFormat", device) -> "TargetModel":
        fmt = WeightFormat.of(weight_format)
        dtype = fmt.dtype
        with torch.device("meta"):  # no random init of weights we are about to overwrite
            model = cls(config)
        ours = {"embed_tokens.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
        if not config.tie_word_embeddings:
            ours["lm_head.weight"] = hf["lm_head.weight"]
        for i, layer in enumerate(model.layers):
            pre = f"model.layers.{i}."
            ours[f"layers.{i}.attn_norm.weight"] = hf[pre + "input_layernorm.weight"]
            ours[f"layers.{i}.mlp_norm.weight"] = hf[pre + "post_attention_layernorm.weight"]
            for name in ("weight", "bias"):
                if getattr(layer.qkv_proj, name) is not None:
                    ours[f"layers.{i}.qkv_proj.{name}"] = torch.cat([hf[f"{pre}self_attn.{p}_proj.{name}"] for p in "qkv"])
                if getattr(layer.gate_up_proj, name) is not None:
                    ours[f"layers.{i}.gate_up_proj.{name}"] = torch.cat([hf[f"{pre}mlp.{p}_proj.{name}"] for p in ("gate", "up")])
                if getattr(layer.o_proj, name) is not None:
                    ours[f"layers.{i}.o_proj.{name}"] = hf[f"{pre}self_attn.o_proj.{name}"]
                if getattr(layer.down_proj, name) is not None:
                    ours[f"layers.{i}.down_proj.{name}"] = hf[f"{pre}mlp.down_proj.{name}"]
            if layer.qk_norm:
                ours[f"layers.{i}.q_norm.weight"] = hf[pre + "self_attn.q_norm.weight"]
                ours[f"layers.{i}.k_norm.weight"] = hf[pre + "self_attn.k_norm.weight"]
        # copy, never alias: the caller's model must not change when ours is cast or moved
        ours = {k: v.detach().to(device=device, dtype=dtype, copy=True) for k, v in ours.items()}
        if config.tie_word_embeddings:
            ours["lm_head.weight"] = ours["embed_tokens.weight"]
        model.load_state_dict(ours, strict=True, assign=True)
        if config.tie_word_embeddings:  # assign=True made two Parameters; share one again
            model.lm_head.weight = model.embed_tokens.weight
        model = model.to(device=device, dtype=dtype).eval()
        fmt.prepare_target(model)
        return model

    @property
    def weight_format(self) -> str:
        """The format's name (engine/cpu/names.py)."""
        return self.fmt.name

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (hidden states, KV cache); logits are always float32."""
        return model_dtype(self)

    def lm_head_weight(self) -> torch.Tensor:
        """The lm_head's [V, hidden] weight as real numbers (the drafter shares it), whatever the format."""
        head = self.lm_head
        return head.dequantized() if hasattr(head, "dequantized") else head.weight

    def new_kv_cache(self, num_slots: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache(num_layers=c.num_hidden_layers, num_kv_heads=c.num_key_value_heads, head_dim=_head_dim(c),
                       num_slots=num_slots, max_len=max_len, dtype=self.dtype,
                       device=self.embed_tokens.weight.device)

    # ---- forward ------------------------------------------------------------------------------

    def _batch(self, segments: list[Segment], cache: KVCache, prompt: bool = False) -> _Batch:
        dev = self.rope_cos.device
        R = len(segments)
        lens = [len(s.tokens) for s in segments]
        starts = [s.start for s in segments]
        slot_list = [s.slot for s in segments]
        N, L, T = max(lens), max(s + n for s, n in zip(starts, lens)), sum(lens)
        if min(lens) < 1:
            raise ValueError("every segment needs at least one token")
        if L > cache.max_len or L > self.rope_cos.shape[0]:
            raise ValueError(f"context {L} exceeds the cache ({cache.max_len}) or max_position_embeddings")
        if len(set(slot_list)) != R:
            raise ValueError("two segments share a slot")

        lens_t = torch.tensor(lens, device=dev)
        starts_t = torch.tensor(starts, device=dev)
        slots = torch.tensor(slot_list, device=dev)
        seg = torch.repeat_interleave(torch.arange(R, device=dev), lens_t, output_size=T)
        first_row = torch.cumsum(lens_t, 0) - lens_t
        offset = torch.arange(T, device=dev) - first_row[seg]
        positions = starts_t[seg] + offset
        consecutive = slot_list == list(range(slot_list[0], slot_list[0] + R))
        G = self.config.num_attention_heads // self.config.num_key_value_heads

        causal = R == 1 and starts[0] == 0 and N > 1
        rows_kernel = self.row_kernels is not None and N <= EXACT_ROWS
        mask = None  # none for one request's decode / verify rows (one by one) and a prompt from 0 (is_causal)
        if not rows_kernel and (R > 1 or (N > EXACT_ROWS and not causal)):
            # padded query rows copy their segment's last row so no row is fully masked
            qpos = starts_t[:, None] + torch.minimum(torch.arange(N, device=dev)[None, :], lens_t[:, None] - 1)
            mask = torch.arange(L, device=dev)[None, None, :] <= qpos[:, :, None]  # [R, N, L]
            mask = mask.repeat_interleave(G, dim=1)[:, None]  # matches the (N, G) fold of query heads
        return _Batch(
            num_segments=R, max_new=N, max_ctx=L, positions=positions, token_slots=slots[seg], slots=slots,
            slot_slice=slice(slot_list[0], slot_list[0] + R) if consecutive else None,
            pad_rows=None if min(lens) == N else seg * N + offset,
            last_rows=first_row + lens_t - 1, mask=mask, causal=causal,
            # tables in float32, applied in the activation dtype, as transformers does
            cos=self.rope_cos[positions][:, None].to(cache.dtype),
            signed_sin=(self.rope_sin[positions][:, None] * self.rope_sign).to(cache.dtype),
            rotate_index=self.rope_index,
            kernels=self.row_kernels, row_keys=positions + 1 if rows_kernel else None,
            rope_cos=self.rope_cos, rope_sin=self.rope_sin, linear=prompt_call if prompt else call,
        )

    @torch.inference_mode()
    def forward_segments(self, segments: list[Segment], cache: KVCache, *, capture_layers: tuple[int, ...] = (),
                         logits_for: str = "all", prompt: bool = False) -> ForwardOutput:
        """Write the segments' K/V into their slots and return logits (and captured hidden states).

        Each segment attends to its slot's cache positions < start plus its own earlier tokens.
        `prompt`: the segments are prompt chunks, which take each Linear layer's prompt path.
        """
        if logits_for not in ("all", "last"):
            raise ValueError(f"logits_for must be 'all' or 'last', got {logits_for!r}")
        b = self._batch(segments, cache, prompt)
        x = self.embed_tokens(torch.cat([s.tokens for s in segments]).to(self.rope_cos.device))
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cache.kv[i], b)
            if i in capture_layers:
                captured[i] = x
        if logits_for == "last":
            x = x[b.last_rows]
        logits = self.lm_head(self.norm(x)).float()
        hidden = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        return ForwardOutput(logits=logits, hidden=hidden)

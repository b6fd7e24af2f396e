"""DSpark drafter: parallel backbone over target context features + sequential Markov stage.

Backbone (DFlash style): H_ctx = hidden_norm(fc([H^l1; ...; H^lm])) is injected into every draft
layer as extra keys/values, K = [k_proj(H_ctx) ; k_proj(H_block)] (no input_layernorm on the
context side, as in SGLang's `write_target_hidden_kv`). A block sees context strictly before its
anchor and attends bidirectionally inside itself. Anchor first: block inputs are
[anchor, mask * (gamma-1)] at positions anchor_pos + k, and position k predicts the token at
anchor_pos + k + 1. Embedding and lm_head are the target's, shared and frozen (buffers that are
not saved). Feature convention: the feature of target layer l is the output of decoder layer l
(transformers `hidden_states[l + 1]`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang_dspark.drafter.backend import DraftBackend, ModuleBackend
from sglang_dspark.drafter.config import DSparkDraftConfig
from sglang_dspark.drafter.heads import MARKOV_HEADS, ConfidenceHead
from sglang_dspark.drafter.layers import DraftDecoderLayer, rope_cos_sin
from sglang_dspark.drafter.sampling import Sampler, is_argmax, temperature_sampler


@dataclass
class DraftOutput:
    tokens: torch.Tensor  # int64 [R, G]
    probs: torch.Tensor | None  # float [R, G, V]: the distribution each token was sampled from; None
    # from a sampler that reports none (argmax_sampler: every token is its position's argmax)
    conf_logits: torch.Tensor  # float [R, G] raw confidence logits; zeros without a head


@dataclass
class TrainOutput:
    logits: torch.Tensor  # [B, A, G, V] backbone + Markov bias from the true previous token
    conf_logits: torch.Tensor  # [B, A, G]; zeros without a confidence head


def _weight(module_or_tensor) -> torch.Tensor:
    if hasattr(module_or_tensor, "dequantized"):  # a quantized lm_head (engine/cpu/formats.py)
        return module_or_tensor.dequantized()
    w = module_or_tensor.weight if hasattr(module_or_tensor, "weight") else module_or_tensor
    return w.detach()


class DSparkDrafter(nn.Module):
    def __init__(self, config: DSparkDraftConfig, target_embed, target_lm_head):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.markov_head = (
            MARKOV_HEADS[config.markov_head_type](config.vocab_size, config.markov_rank, h)
            if config.has_markov
            else None
        )
        self.confidence_head = (
            ConfidenceHead(h, config.markov_rank, config.confidence_head_with_markov)
            if config.enable_confidence_head
            else None
        )
        # Shared with the frozen target: never trained, never saved.
        self.register_buffer("embed_weight", _weight(target_embed), persistent=False)
        self.register_buffer("lm_head_weight", _weight(target_lm_head), persistent=False)
        # Optional hot draft vocabulary and its rows of the vocabulary-sized weights (set_draft_vocab).
        for name in ("draft_vocab", "_vocab_lm_head", "_vocab_markov_w2"):
            self.register_buffer(name, None, persistent=False)
        # inference on the CPU row kernels (engine/cpu/draft_rows.py), set by engine/cpu/formats.py: a
        # plain attribute, not a submodule, so its int8 copies never enter the state dict
        self.rows: DraftBackend | None = None
        self.modules_backend = ModuleBackend(self)  # the same arithmetic through the modules above

    def backend_for(self, kv: torch.Tensor) -> DraftBackend:
        """The row kernels where attached and they take this cache, else the modules."""
        return self.rows if self.rows is not None and self.rows.accepts(kv) else self.modules_backend

    @property
    def gamma(self) -> int:
        return self.config.block_size

    # ---- backbone -------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (its layers' weights'); logits and confidences are float32."""
        return self.norm.weight.dtype

    def _rope(self, positions: torch.Tensor):
        # in the activation dtype: float32 tables would promote q and k but not v
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype=self.dtype)

    def context_kv(self, target_hidden: torch.Tensor, positions: torch.Tensor):
        """Per layer (K, V) [..., T, kv_heads, head_dim] of target features [..., T, m*H]."""
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.dtype)))
        cos, sin = self._rope(positions)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def backbone(self, block_ids, block_pos, ctx_kv, mask) -> torch.Tensor:
        """Final normed hidden [B, Q, H]. block_ids/block_pos [B, Q]; ctx_kv per layer
        ([B, C, kv, hd] K and V); mask bool [B, Q, C + Q] over [context ; block] keys."""
        x = nn.functional.embedding(block_ids, self.embed_weight).to(self.dtype)
        cos, sin = self._rope(block_pos)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, mask)
        return self.norm(x)

    def base_logits(self, hidden: torch.Tensor, lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the rows of `lm_head` (default: the target's, the whole vocabulary)."""
        lm_head = self.lm_head_weight if lm_head is None else lm_head
        return (hidden @ lm_head.T.to(hidden.dtype)).float()

    def _prev_embeddings(self, prev_tokens: torch.Tensor):
        if self.confidence_head is None or not self.confidence_head.with_markov:
            return None
        return self.markov_head.prev_embeddings(prev_tokens)

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        if self.confidence_head is None:
            return hidden.new_zeros(hidden.shape[:-1], dtype=torch.float32)
        return self.confidence_head(hidden, self._prev_embeddings(prev_tokens)).float()

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft only from `token_ids` (a hot vocabulary, as FR-Spec and SGLang's
        `--speculative-token-map` do for EAGLE), or from the whole vocabulary (None).

        The drafter's vocabulary-sized GEMMs (lm_head over gamma positions, Markov bias at each
        step) shrink from V to len(token_ids) rows; on a CPU they are most of a draft's cost.
        Verification is unchanged: the draft distribution is reported over the full vocabulary
        with q = 0 outside the hot set, so rejection sampling stays exact. Inference only:
        training always uses the full vocabulary.
        """
        if token_ids is None:
            self.draft_vocab = self._vocab_lm_head = self._vocab_markov_w2 = None
        else:
            self._set_draft_vocab(token_ids)
        if self.rows is not None:
            self.rows.vocab_changed(self)

    def _set_draft_vocab(self, token_ids) -> None:
        """Check `token_ids` and keep them with their rows of the lm_head and Markov W2."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.lm_head_weight.device)
        vocab = self.lm_head_weight.shape[0]
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"draft vocabulary: expected a non-empty 1-D list of token ids, got shape {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"draft vocabulary: token ids must lie in [0, {vocab})")
        if ids.unique().numel() != ids.numel():
            raise ValueError("draft vocabulary: token ids must be unique")
        self.draft_vocab = ids
        self._vocab_lm_head = self.lm_head_weight[ids].contiguous()  # [S, H]
        if self.markov_head is not None:
            self._vocab_markov_w2 = self.markov_head.markov_w2.weight.detach()[ids].contiguous()  # [S, rank]

    def _expand_to_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., S] probabilities over the draft vocabulary -> [..., V] (zero outside it)."""
        if self.draft_vocab is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.lm_head_weight.shape[0])
        return full.index_copy_(-1, self.draft_vocab, probs)

    # ---- training ---------------------------------------------------------------------------

    def forward_train(self, input_ids, context, anchor_pos, anchor_valid, context_window: int | None = None) -> TrainOutput:
        """Teacher-forced blocks at many anchors per sequence.

        input_ids int64 [B, N]; context [B, C, m*H] target features at positions 0..C-1;
        anchor_pos int64 [B, A]; anchor_valid bool [B, A] (padding anchors are ignored by the
        loss). The Markov bias and confidence of block position k read the true token at
        anchor_pos + k (the anchor for k = 0). With `context_window` w a block sees only the last w
        context positions before its anchor (a training curriculum; inference sees them all).
        """
        b, n = input_ids.shape
        c = context.shape[1]
        a = anchor_pos.shape[1]
        g = self.gamma
        offsets = torch.arange(g, device=input_ids.device)
        pos = anchor_pos.unsqueeze(-1) + offsets  # [B, A, G]
        block_ids = torch.full_like(pos, self.config.mask_token_id)
        block_ids[..., 0] = input_ids.gather(1, anchor_pos)
        ctx_positions = torch.arange(c, device=input_ids.device).expand(b, c)
        ctx_kv = self.context_kv(context, ctx_positions)
        # Query (block i, k) sees context j < anchor_i and all of block i, no other block.
        sees_ctx = ctx_positions[:, None, :] < anchor_pos[:, :, None]  # [B, A, C]
        if context_window is not None:
            sees_ctx &= ctx_positions[:, None, :] >= anchor_pos[:, :, None] - context_window
        sees_ctx = sees_ctx[:, :, None, :].expand(b, a, g, c).reshape(b, a * g, c)
        block_of = torch.arange(a, device=input_ids.device).repeat_interleave(g)
        sees_block = (block_of[:, None] == block_of[None, :]).expand(b, a * g, a * g)
        mask = torch.cat([sees_ctx, sees_block], dim=-1)
        hidden = self.backbone(block_ids.view(b, -1), pos.view(b, -1), ctx_kv, mask)
        hidden = hidden.view(b, a, g, -1)
        logits = self.base_logits(hidden)
        prev = input_ids.gather(1, pos.view(b, -1).clamp(max=n - 1)).view(b, a, g)
        if self.markov_head is not None:
            state = self.markov_head.init_state(hidden[:, :, 0])
            biases = []
            for k in range(g):
                bias, state = self.markov_head.step_bias(prev[..., k], hidden[:, :, k], state)
                biases.append(bias)
            logits = logits + torch.stack(biases, dim=2).float()
        return TrainOutput(logits=logits, conf_logits=self.confidence(hidden, prev))

    # ---- inference --------------------------------------------------------------------------

    @torch.no_grad()
    def draft(
        self,
        cache: "DraftKVCache",
        slots: list[int],
        anchors: torch.Tensor,
        anchor_pos: torch.Tensor,
        sampler: Sampler | None = None,
        generator: torch.Generator | None = None,
        block: int | None = None,
    ) -> DraftOutput:
        """Draft one block of `block` (default gamma) tokens for each request r in `slots` (one
        batched backbone pass, then the sequential stage over the block's positions).

        A shorter block is the first `block` positions of the trained one, attending to each other
        only: what a step that can verify at most `block` drafts a request needs (the planner knows
        that before the draft runs). Its drafts come from other hidden states than the whole
        block's, which verification does not mind: it reads the probabilities drafted from."""
        sampler = sampler or temperature_sampler(1.0, generator)
        device = self.fc.weight.device
        anchors = anchors.to(device=device, dtype=torch.long)
        anchor_pos = anchor_pos.to(device=device, dtype=torch.long)
        g = self.gamma if block is None else int(block)
        if not 1 <= g <= self.gamma:
            raise ValueError(f"block: between 1 and the drafter's block size {self.gamma}, got {block}")
        r = len(slots)
        anchor_list = anchor_pos.tolist()
        for slot, p in zip(slots, anchor_list):
            if cache.length(slot) < p:
                raise ValueError(f"slot {slot} holds {cache.length(slot)} context positions, anchor at {p}")
        cache.flush(slots)
        slot_index = torch.as_tensor(slots, device=device)
        block_ids = torch.full((r, g), self.config.mask_token_id, device=device, dtype=torch.long)
        block_ids[:, 0] = anchors
        pos = anchor_pos[:, None] + torch.arange(g, device=device)
        backend = self.backend_for(cache.kv)
        hidden = backend.block_hidden(cache, slot_index, anchor_pos, block_ids, pos)
        if hidden is None:  # a geometry the row kernels do not serve
            backend = self.modules_backend
            hidden = backend.block_hidden(cache, slot_index, anchor_pos, block_ids, pos)
        base = backend.logits(hidden)  # [R, G, V], or [R, G, S] over a draft vocabulary
        chain = backend.greedy_chain(base, anchors) if is_argmax(sampler) else None
        if chain is not None:  # every position's argmax in one kernel call: no per-position Python
            tokens, probs = chain, None
        else:
            tokens, probs = self._sequential_stage(base, hidden, anchors, sampler, backend)
        prev_tokens = torch.cat([anchors[:, None], tokens[:, :-1]], dim=1)
        if self.confidence_head is not None:
            conf_logits = backend.confidence(hidden, self._prev_embeddings(prev_tokens))
        else:
            conf_logits = hidden.new_zeros(hidden.shape[:-1], dtype=torch.float32)
        return DraftOutput(tokens=tokens, probs=probs, conf_logits=conf_logits)

    def _sequential_stage(self, base, hidden, anchors, sampler, backend: DraftBackend):
        """The Markov bias and a sample, position after position: (tokens [R, G], the distributions
        sampled from [R, G, V] or None)."""
        vocab = self.draft_vocab
        tokens, probs = [], []
        prev = anchors
        state = self.markov_head.init_state(hidden[:, 0]) if self.markov_head is not None else None
        for k in range(base.shape[1]):
            step_logits = base[:, k]
            if self.markov_head is not None:
                features, state = self.markov_head.step_features(prev, hidden[:, k], state)
                step_logits = step_logits + backend.markov_bias(features)  # float32 + bfloat16 promotes exactly: no .float() copy
            choice, p = sampler(step_logits, k)
            prev = choice if vocab is None else vocab[choice]  # the Markov head reads real token ids
            tokens.append(prev)
            probs.append(p)
        if any(p is None for p in probs) and not all(p is None for p in probs):
            raise ValueError("the sampler reported probabilities for some positions of the block but not all")
        probs = None if probs[0] is None else self._expand_to_vocab(torch.stack(probs, dim=1))  # once, not per position
        return torch.stack(tokens, dim=1), probs


STAGE_ROWS = 512  # per slot: decode rows staged in place between drafts (DraftKVCache)


class DraftKVCache:
    """Preallocated context K/V of every draft layer, per slot (request).

    `append` only stages target features; `flush` projects everything staged, over all slots, in
    one batched `context_kv` call (the drafter flushes the slots it drafts for). The engine appends
    every step but drafts only when the planner finds a draft worth verifying, so keeping the
    context current costs one matmul per draft instead of R small calls per step.

    Layout: `kv` [layers, 2, slots, kv_heads, max_len, head_dim], the target's KV cache layout
    (engine/kv_cache.py), so that a layer's [2, slots, kv_heads, max_len, head_dim] is what the row
    kernels read and write (engine/cpu/draft_rows.py); `k` and `v` are views [layers, slots, max_len,
    kv_heads, head_dim].
    """

    def __init__(self, drafter: DSparkDrafter, num_slots: int, max_len: int,
                 dtype=None, device="cpu", zeros=torch.zeros):
        cfg = drafter.config
        dtype = dtype or drafter.dtype  # the K/V the drafter's attention reads, in its own dtype
        shape = (cfg.num_hidden_layers, 2, num_slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.drafter = drafter
        self.kv = zeros(shape, dtype=dtype, device=device)  # `zeros`: the engine passes its lazy allocator
        self.lengths = [0] * num_slots
        self.max_len = max_len
        # Per slot, not yet projected: prompt chunks, disjoint (start, features [n, m*H]) pieces in
        # ascending order, then the rows in the slot's staging buffer, positions buf_start.. (buf_used
        # rows; none: buf_start -1), which always lie above the pieces.
        self._staged: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(num_slots)]
        self.buf_start, self.buf_used = [-1] * num_slots, [0] * num_slots
        # Decode steps' rows are copied into the per-slot buffer, not kept as views of each step's
        # hidden-state tensor: with every step's tensor kept alive until the next draft, plain steps
        # ran measurably slower (heap fragmentation, most likely). Pages are committed as written.
        feat = len(cfg.target_layer_ids) * cfg.hidden_size
        self._buf = zeros((num_slots, STAGE_ROWS, feat), dtype=dtype, device=device)

    @property
    def k(self) -> torch.Tensor:
        return self.kv[:, 0].transpose(2, 3)

    @property
    def v(self) -> torch.Tensor:
        return self.kv[:, 1].transpose(2, 3)

    def append(self, slot: int, positions: torch.Tensor, target_hidden: torch.Tensor) -> None:
        """Stage the context features at `positions` (contiguous, starting at or before the current
        length); the slot then holds positions < positions[-1] + 1."""
        if positions.numel() == 0:
            return
        start, end = int(positions[0]), int(positions[-1]) + 1
        if end - start != positions.numel() or target_hidden.shape[0] != end - start:
            raise ValueError("positions must be contiguous, one per feature row")
        self.stage(slot, start, target_hidden)

    def stage(self, slot: int, start: int, target_hidden: torch.Tensor) -> None:
        """`append` for positions start, start + 1, ... one per row of target_hidden [n, m*H], without
        a positions tensor."""
        self.stage_rows([slot], [start], target_hidden, [0], [target_hidden.shape[0]])

    def stage_rows(self, slots: list[int], starts: list[int], hidden: torch.Tensor, offsets: list[int],
                   counts: list[int]) -> None:
        """Stage, for each i, rows offsets[i] .. + counts[i] of `hidden` [N, m*H] at positions
        starts[i] .. of slots[i]: a decode step's committed rows of every request. Rows that extend
        their slot's buffer are copied in with one indexed write for the whole step (a Python call and
        a copy per request were most of what staging cost a step); the rest go one by one."""
        if len(set(slots)) != len(slots):  # a slot's pending rows would be flushed before they are written
            raise ValueError(f"slots {slots}: each slot at most once a call")
        if self._append_one_each(slots, starts, hidden, offsets, counts):
            return
        dst_slot, dst_row, src = [], [], []
        for slot, start, offset, n in zip(slots, starts, offsets, counts):
            end = start + n
            if n == 0:
                continue
            if start > self.lengths[slot] or end > self.max_len:
                raise ValueError(f"slot {slot}: cannot write [{start}, {end}) with length "
                                 f"{self.lengths[slot]}, capacity {self.max_len}")
            if start < self.lengths[slot]:  # a rewrite: the staged rows from `start` on are stale
                self._drop_staged_from(slot, start)
            if n > STAGE_ROWS // 4:  # a prompt chunk: its own tensor, kept until projected, above the buffer
                if self.buf_used[slot]:
                    self.flush([slot])
                self._staged[slot].append((start, hidden[offset:offset + n]))
            else:  # a decode step's rows: into the slot's buffer
                used = self.buf_used[slot]
                if used and (self.buf_start[slot] + used != start or used + n > STAGE_ROWS):
                    self.flush([slot])  # the buffer is full, or its rows are not contiguous with these
                    used = 0
                if used == 0:
                    self.buf_start[slot] = start
                dst_slot += [slot] * n
                dst_row += range(used, used + n)
                src += range(offset, offset + n)
                self.buf_used[slot] = used + n
            self.lengths[slot] = end
        if src:
            self._write_rows(dst_slot, dst_row, hidden, src)

    def _append_one_each(self, slots, starts, hidden, offsets, counts) -> bool:
        """The step that drafted nothing: one row a slot, each extending its buffer, staged in one
        copy (an engine that is not drafting pays staging every step, so it must cost what a
        target-only step does not notice). False, and nothing staged, when any row is not so."""
        lengths, used, buf_start = self.lengths, self.buf_used, self.buf_start
        if not slots:
            return False
        for slot, start, n in zip(slots, starts, counts):
            u = used[slot]
            if (n != 1 or start != lengths[slot] or start >= self.max_len or u >= STAGE_ROWS
                    or (u and buf_start[slot] + u != start)):
                return False
        rows = [used[slot] for slot in slots]
        for slot, start in zip(slots, starts):
            if not used[slot]:
                buf_start[slot] = start
            used[slot] += 1
            lengths[slot] = start + 1
        self._write_rows(slots, rows, hidden, list(offsets))
        return True

    def _write_rows(self, slots: list[int], rows: list[int], hidden: torch.Tensor, src: list[int]) -> None:
        """hidden[src[i]] into buffer row rows[i] of slots[i], in one copy: a slice when the rows are
        one slot's (each slot comes once a call, its rows consecutive), else one index_copy_ into the
        flattened buffer (a copy per slot was three torch calls each, each a cache miss right after
        the forward; index_put_ with two index tensors cost more still)."""
        picked = hidden[src[0]:src[0] + len(src)] if src == list(range(src[0], src[0] + len(src))) \
            else hidden[torch.tensor(src)]
        if slots[0] == slots[-1]:
            self._buf[slots[0], rows[0]:rows[0] + len(rows)].copy_(picked)
            return
        flat = self._buf.view(-1, self._buf.shape[-1])
        index = torch.tensor([slot * STAGE_ROWS + row for slot, row in zip(slots, rows)])
        flat.index_copy_(0, index, picked.to(flat.dtype))

    def truncate(self, slot: int, length: int) -> None:
        self.lengths[slot] = min(self.lengths[slot], int(length))
        self._drop_staged_from(slot, self.lengths[slot])

    def length(self, slot: int) -> int:
        return self.lengths[slot]

    def _drop_staged_from(self, slot: int, start: int) -> None:
        """Forget staged features at positions >= start (they are being rewritten or rolled back)."""
        self._staged[slot] = [(s, h[: start - s]) for s, h in self._staged[slot] if s < start]
        if self.buf_used[slot]:
            self.buf_used[slot] = max(0, min(self.buf_used[slot], start - self.buf_start[slot]))

    def staged_pieces(self, slot: int) -> list[tuple[int, torch.Tensor]]:
        """The slot's staged (start, features) pieces in position order, its buffer's rows last."""
        pieces = list(self._staged[slot])
        if self.buf_used[slot]:
            pieces.append((self.buf_start[slot], self._buf[slot, : self.buf_used[slot]]))
        return pieces

    @torch.no_grad()
    def flush(self, slots=None) -> None:
        """Project the staged features of `slots` (default: all) into K/V, in one batched call."""
        slots = range(len(self._staged)) if slots is None else sorted(set(int(s) for s in slots))
        pieces = [(slot, s, h) for slot in slots for s, h in self.staged_pieces(slot)]
        if not pieces:
            return
        device = self.kv.device
        hidden = torch.cat([h for _, _, h in pieces]).to(device)
        # indices in a few vectorized ops: a slot undrafted for 256 steps stages 256 pieces, and an
        # arange and a full per piece would cost more than the probe's own step
        lens = torch.tensor([h.shape[0] for _, _, h in pieces], device=device)
        first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens, output_size=hidden.shape[0])
        positions = (torch.repeat_interleave(torch.tensor([s for _, s, _ in pieces], device=device), lens,
                                             output_size=hidden.shape[0])
                     + torch.arange(hidden.shape[0], device=device) - first)
        slot_index = torch.repeat_interleave(torch.tensor([slot for slot, _, _ in pieces], device=device), lens,
                                             output_size=hidden.shape[0])
        self.drafter.backend_for(self.kv).store_context(self.kv, hidden, positions, slot_index)
        for slot in slots:
            self._staged[slot], self.buf_used[slot] = [], 0

"""The correctness canary: greedy outputs replayed without speculation, token for token.

Speculative decoding is lossless only as far as its kernels are right; DSpark has shipped silent
corruption elsewhere (identifiers corrupted at 0.3-0.8 % of requests, sgl-project/sglang#34959).
The canary takes a share of finished greedy requests (chosen by a hash of their id, so the choice
does not depend on their content), decodes each again with speculation off, at spare capacity
only (a free KV slot and nobody waiting), and compares the two outputs token for token. Every
mismatch is counted (`sglang_dspark_canary_mismatches_total`, which alerts), logged with the first
differing position, and kept as evidence (a JSON line per replay in `evidence_dir`).

Rounding is not corruption, where rounding depends on the batch. On the row kernels (int8 and int4
where they run) every row is computed on its own, so a replay computes the original's very bits and
any difference is a defect: a mismatch, no allowance (`WeightFormat.batch_invariant`). In bfloat16,
and in int8 / int4 on aten's kernels, a request's logits depend on what it was batched with (one
masked attention call over the batch, oneDNN's kernel per row count), and logits tie often at that
precision, so a replay batched with other traffic can take the other side of a near tie and then
decode on differently: on the int4 SmolLM2 before the row kernels, 7 of 32 replays under batched
load did (bfloat16: 15), none in float32 (benchmarks/canary_ties.py). There, at the first token that
differs the replay's own logits say how far the original's token fell below the replay's choice,
in units of bfloat16's resolution at that logit (its ulp: 0.125 for logits of 16-32); within
`NEAR_TIE_ULPS` of the served format that is a near tie (counted apart,
`sglang_dspark_canary_near_ties_total`, logged and kept as evidence, no alert), beyond it a
mismatch. float32 allows none: its batched rows are bit-equal to a request's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sglang_dspark.engine.cpu.formats import WeightFormat
from sglang_dspark.engine.request import Request

logger = logging.getLogger(__name__)

MAX_QUEUED = 64  # replays waiting for spare capacity; older ones are dropped (and counted)
MATCH, NEAR_TIE, MISMATCH = "match", "near_tie", "mismatch"
# how far below the replay's choice the original's token may be and still count as a near tie, in
# bfloat16 ulps at the replay's logit, is the served format's (WeightFormat.near_tie_ulps,
# engine/cpu/formats.py); a format with none (float32) allows none, not even an exact tie. Clean
# batched replays of SmolLM2 left the original at 0-3 ulps (22 of 64, bfloat16 and int4); replays of
# an injected acceptance fault at 0-1 in 5 of 64 (indistinguishable from a tie) and at 5 or more in
# the rest (benchmarks/canary_ties.py)


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 values (8 significant bits) at magnitude |x|."""
    return 2.0 ** (math.frexp(max(abs(x), 2.0 ** -126))[1] - 8)


def divergence_margin(tokens: list[int], logits, expected: list[int], params, *, end_ids=(),
                      legal: Callable[[], torch.Tensor] | None = None) -> float | None:
    """At the first of a replay's new `tokens` (target logits `logits`, one row each) that differs
    from the original's `expected` continuation: logit of the replay's token minus that of the
    original's, with the request's logit_bias (what greedy sampling compared), in bfloat16 ulps at
    the replay's logit. Past the original's end the original's token was an EOS of `end_ids` (the
    best of them; none given: the original ended otherwise, inf). inf where the original's token is
    not legal under the replay's grammar now (`legal()`: its mask; the replay commits one token a
    step, so the mask is the one before it). None while they agree. A negative margin (the original
    took a token the replay's own logits rank higher than its choice) cannot be rounding."""
    for j, token in enumerate(tokens):
        if j < len(expected) and token == expected[j]:
            continue
        bias, row = dict(params.logit_bias), logits[j].float()  # only at the first difference
        picked = float(row[token]) + bias.get(token, 0.0)
        if j < len(expected):
            mask = None if legal is None else legal()
            if mask is not None and (expected[j] >= mask.shape[0] or not bool(mask[expected[j]])):
                return math.inf
            original = float(row[expected[j]]) + bias.get(expected[j], 0.0)
        elif end_ids:
            original = max(float(row[e]) + bias.get(e, 0.0) for e in end_ids if e < row.shape[0])
        else:
            return math.inf
        return (picked - original) / bf16_ulp(picked)
    return None


@dataclass(frozen=True)
class Replay:
    original_id: str
    prompt_ids: list[int]
    params: object  # SamplingParams of the original request
    speculative: list[int]  # what the original emitted
    ended_on_eos: bool = False  # ... and then an EOS token, which `speculative` leaves out


def chosen(request_id: str, share: float) -> bool:
    """Whether a request is replayed: a hash of its id below `share` (reproducible, content-blind)."""
    digest = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")
    return digest / 2**64 < share


class Canary:
    def __init__(self, share: float, evidence_dir: str | Path | None = None):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"canary share: must be in [0, 1], got {share}")
        self.share = share
        self.evidence_dir = Path(evidence_dir) if evidence_dir else None
        self.queue: deque[Replay] = deque()
        self.replays = self.mismatches = self.near_ties = self.dropped = 0

    def consider(self, req: Request) -> None:
        """A request finished: queue its replay when it is greedy, complete and chosen."""
        if (self.share and req.params.greedy and req.replay_of is None and req.finish_reason in ("stop", "length")
                and chosen(req.id, self.share)):
            if len(self.queue) == MAX_QUEUED:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(Replay(req.id, list(req.prompt_ids), req.params, list(req.output_ids), req.ended_on_eos))

    def next_request(self, make_request) -> Request | None:
        """The next replay as a request without speculation (`make_request(replay)` builds it)."""
        if not self.queue:
            return None
        replay = self.queue.popleft()
        req = make_request(replay)
        req.replay_of, req.no_draft, req.expected = replay.original_id, True, replay.speculative
        req.expected_eos = replay.ended_on_eos
        return req

    def finished(self, req: Request, fmt: WeightFormat) -> str | None:
        """A replay ended: MATCH, NEAR_TIE (it left the original at a near tie of the served format's
        rounding), MISMATCH (logged at error, kept), or None if aborted."""
        if req.finish_reason == "abort":
            return None
        self.replays += 1
        replayed, speculative = req.output_ids, req.expected
        if replayed == speculative:
            return MATCH
        first = next((i for i, (a, b) in enumerate(zip(replayed, speculative)) if a != b),
                     min(len(replayed), len(speculative)))
        margin = math.inf if req.divergence_margin is None else req.divergence_margin
        near_tie = fmt.near_tie_ulps is not None and 0.0 <= margin <= fmt.near_tie_ulps
        if near_tie:
            self.near_ties += 1
            logger.warning("canary: request %s left its replay at a near tie at token %d (the original's token %.2f "
                           "bfloat16 ulps below the replay's, %s rounding)", req.replay_of, first, margin, fmt.name)
        else:
            self.mismatches += 1
            logger.error("canary: request %s decoded differently without speculation from token %d on "
                         "(%d speculative vs %d replayed tokens; the original's token %.2f bfloat16 ulps below "
                         "the replay's)", req.replay_of, first, len(speculative), len(replayed), margin)
        if self.evidence_dir is not None:
            self.evidence_dir.mkdir(parents=True, exist_ok=True)
            record = {"request_id": req.replay_of, "first_difference": first, "prompt_ids": req.prompt_ids,
                      "speculative": speculative, "replayed": replayed, "weight_format": fmt.name,
                      "margin_ulps": None if math.isinf(margin) else round(margin, 3), "near_tie": near_tie}
            with open(self.evidence_dir / "canary_mismatches.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        return NEAR_TIE if near_tie else MISMATCH


def replay_params(params):
    """The original's sampling parameters, without logprobs (nobody reads them)."""
    return replace(params, logprobs=False, top_logprobs=0)

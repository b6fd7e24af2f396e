"""The correctness canary: greedy outputs replayed without speculation, token for token.

Speculative decoding is lossless only as far as its kernels are right; DSpark has shipped silent
corruption elsewhere (identifiers corrupted at 0.3-0.8 % of requests, sgl-project/sglang#34959).
The canary takes a share of finished greedy requests (chosen by a hash of their id, so the choice
does not depend on their content), decodes each again with speculation off, at spare capacity
only (a free KV slot and nobody waiting), and compares the two outputs token for token. Every
mismatch is counted (`sglang_dspark_canary_mismatches_total`, which alerts), logged with the first
differing position, and kept as evidence (a JSON line per replay in `evidence_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_dspark.engine.request import Request

logger = logging.getLogger(__name__)

MAX_QUEUED = 64  # replays waiting for spare capacity; older ones are dropped (and counted)


@dataclass(frozen=True)
class Replay:
    original_id: str
    prompt_ids: list[int]
    params: object  # SamplingParams of the original request
    speculative: list[int]  # what the original emitted


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
        self.replays = self.mismatches = self.dropped = 0

    def consider(self, req: Request) -> None:
        """A request finished: queue its replay when it is greedy, complete and chosen."""
        if (self.share and req.params.greedy and req.replay_of is None and req.finish_reason in ("stop", "length")
                and chosen(req.id, self.share)):
            if len(self.queue) == MAX_QUEUED:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(Replay(req.id, list(req.prompt_ids), req.params, list(req.output_ids)))

    def next_request(self, make_request) -> Request | None:
        """The next replay as a request without speculation (`make_request(replay)` builds it)."""
        if not self.queue:
            return None
        replay = self.queue.popleft()
        req = make_request(replay)
        req.replay_of, req.no_draft, req.expected = replay.original_id, True, replay.speculative
        return req

    def finished(self, req: Request) -> bool | None:
        """A replay ended: True when it matched, False on a mismatch (logged, kept), None if aborted."""
        if req.finish_reason == "abort":
            return None
        self.replays += 1
        replayed, speculative = req.output_ids, req.expected
        if replayed == speculative:
            return True
        self.mismatches += 1
        first = next((i for i, (a, b) in enumerate(zip(replayed, speculative)) if a != b),
                     min(len(replayed), len(speculative)))
        logger.error("canary: request %s decoded differently without speculation from token %d on "
                     "(%d speculative vs %d replayed tokens)", req.replay_of, first, len(speculative), len(replayed))
        if self.evidence_dir is not None:
            self.evidence_dir.mkdir(parents=True, exist_ok=True)
            record = {"request_id": req.replay_of, "first_difference": first, "prompt_ids": req.prompt_ids,
                      "speculative": speculative, "replayed": replayed}
            with open(self.evidence_dir / "canary_mismatches.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        return False


def replay_params(params):
    """The original's sampling parameters, without logprobs (nobody reads them)."""
    return replace(params, logprobs=False, top_logprobs=0)

"""A failed step's fault, kept to the request that caused it.

When `Engine.run` raises, the step is run again on parts of its batch (halves, then halves of the
failing halves) until the requests whose presence alone makes it fail are found. Only they end;
the rest of the step then runs without them and commits as usual. A run only writes cache
positions at or beyond each request's committed length (they are rewritten by the next run) and
re-stages drafter context it would stage anyway, so the probing runs leave no trace in what the
innocent requests produce; nothing is committed until a run succeeds.

No single culprit (the fault needs several requests together), or every request of a batch of two
or more failing alone, is the engine's fault, not a request's: `EngineFault`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_dspark.engine.request import Request
from sglang_dspark.engine.scheduler import ScheduledBatch

logger = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """A step failed for a reason no single request explains."""


def requests_of(batch: ScheduledBatch) -> list[Request]:
    """Each request of the batch once, prefill chunks first, in order."""
    seen: dict[str, Request] = {}
    for req in [c.request for c in batch.prefill] + list(batch.decode):
        seen.setdefault(req.id, req)
    return list(seen.values())


def restricted(batch: ScheduledBatch, members: list[Request]) -> ScheduledBatch:
    ids = {r.id for r in members}
    return ScheduledBatch(prefill=[c for c in batch.prefill if c.request.id in ids],
                          decode=[r for r in batch.decode if r.id in ids])


def culprits(batch: ScheduledBatch, fails: Callable[[ScheduledBatch], bool]) -> list[Request]:
    """The requests of `batch` that make a step fail on their own (`fails(part)`: the step over
    `part` raised). Raises EngineFault when no such request explains the failure."""
    suspects = requests_of(batch)
    found = _bisect(suspects, batch, fails) if len(suspects) > 1 else suspects
    if not found:
        raise EngineFault(f"a step of {len(suspects)} requests failed, and no part of it fails alone")
    if len(found) == len(suspects) > 1:
        raise EngineFault(f"every one of the step's {len(suspects)} requests fails alone")
    return found


def _bisect(reqs: list[Request], batch: ScheduledBatch, fails) -> list[Request]:
    if len(reqs) == 1:
        return list(reqs)
    mid = len(reqs) // 2
    found: list[Request] = []
    for part in (reqs[:mid], reqs[mid:]):
        if fails(restricted(batch, part)):
            found += _bisect(part, batch, fails)
    return found


def failing(run: Callable[[ScheduledBatch], object]) -> Callable[[ScheduledBatch], bool]:
    """`run` as a predicate: True when it raised (logged at debug level)."""
    def fails(part: ScheduledBatch) -> bool:
        try:
            run(part)
        except Exception:
            logger.debug("step over %d requests failed", len(requests_of(part)), exc_info=True)
            return True
        return False

    return fails

"""Per-step records, the shape SGLang's `/server_info` gives them
(`internal_states[0].dspark_info_record.records`), so one profiler reads both servers."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepRecord:
    bs: int  # requests in the decode step
    budget: int  # the policy's verify capacity (drafts)
    num_verify_tokens: int  # requests + verified drafts
    accepted_drafts: int
    drafted: bool  # whether the drafter ran
    probe: bool  # drafted to measure (confidences, an unexplored budget), not because it pays
    predicted_step_ms: float | None  # what the SPS table priced the step at
    step_ms: float  # measured: draft + verify forward + verification + commit
    draft_ms: float
    target_verify_ms: float
    time: float  # wall clock (seconds since the epoch) when the step ended

    def to_dict(self) -> dict:
        return asdict(self)


class StepRecords:
    """The last `maxlen` decode steps, oldest first; `total` counts every step ever recorded, and
    `request_steps` / `emitted` their requests and committed tokens (also never cleared)."""

    def __init__(self, maxlen: int):
        self._records: deque[StepRecord] = deque(maxlen=maxlen)
        self.total = self.request_steps = self.emitted = 0

    def append(self, record: StepRecord) -> None:
        self._records.append(record)
        self.total += 1
        self.request_steps += record.bs
        self.emitted += record.bs + record.accepted_drafts  # each request's bonus token and its accepted drafts

    def avg_accept_length(self) -> float | None:
        """SGLang's avg_spec_accept_length: committed tokens per request per decode step, since start.
        A step that verified no drafts counts as 1 per request, as SGLang counts a DSpark step whose
        budget is 0 (it still runs the verify forward)."""
        return self.emitted / self.request_steps if self.request_steps else None

    def clear(self) -> None:
        self._records.clear()

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self):
        return iter(self._records)

    def since(self, total: int) -> list[StepRecord]:
        """The records of the steps after the first `total` (a caller remembers `.total`, runs
        steps, then asks), as far as they are still kept."""
        first_kept = self.total - len(self._records)
        return list(self._records)[max(0, total - first_kept):]

    def as_dicts(self) -> list[dict]:
        return [r.to_dict() for r in self._records]

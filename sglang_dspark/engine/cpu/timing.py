"""The one timing loop of the format decisions taken at load (auto's bfloat16 check, float32's
layouts, bfloat16's one-row kernel): the arms interleaved round by round, so whatever else the host
does hits them alike, and a first round that only warms them up."""

from __future__ import annotations

from collections.abc import Callable, Hashable


def interleaved(arms: dict[Hashable, Callable[[], float]], reps: int) -> dict[Hashable, list[float]]:
    """{arm: the `reps` seconds each of its calls returned}, after one warm-up round of every arm.
    Each arm is a call that times itself (tests inject ones that return set figures)."""
    times: dict[Hashable, list[float]] = {arm: [] for arm in arms}
    for round_ in range(reps + 1):
        for arm, call in arms.items():
            seconds = call()
            if round_:
                times[arm].append(seconds)
    return times

"""What each simulated user asks: a prompt of some domain, an output length, an OpenAI request body.

Prompts come from `sglang_dspark.prompts.load_prompts` (default `builtin:heldout`: code, chat and
math prompts held out from the drafter's training). Each request draws a domain uniformly, then a
prompt of that domain uniformly, so every domain gets the same share of traffic whatever its size.
Every user draws from its own `random.Random`, seeded from the run's seed and the user's place
(worker index, user number), so a run's request sequence per user is the same every time.
Requests set `ignore_eos`, so the number of output tokens is the number asked for.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from sglang_dspark.prompts import load_prompts

DEFAULT_PROMPTS = "builtin:heldout"
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
ENDPOINT_CHOICES = (*ENDPOINTS, "mixed")
LENGTH_SPEC_HELP = "N (fixed), uniform:LO:HI (integers, inclusive) or lognormal:MEDIAN:SIGMA (rounded, at least 2)"


@dataclass(frozen=True)
class OutputLength:
    """A fixed number of output tokens, or a distribution of them."""

    kind: str  # "fixed" | "uniform" | "lognormal"
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> OutputLength:
        """From `LENGTH_SPEC_HELP`'s forms; ValueError naming the spec otherwise."""
        parts = str(spec).strip().split(":")
        try:
            if len(parts) == 1 and int(parts[0]) >= 1:
                return cls("fixed", int(parts[0]))
            if len(parts) == 3 and parts[0] == "uniform" and 1 <= int(parts[1]) <= int(parts[2]):
                return cls("uniform", int(parts[1]), int(parts[2]))
            if len(parts) == 3 and parts[0] == "lognormal" and float(parts[1]) >= 1 and float(parts[2]) >= 0:
                return cls("lognormal", float(parts[1]), float(parts[2]))
        except ValueError:
            pass
        raise ValueError(f"output length {spec!r}: expected {LENGTH_SPEC_HELP}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(2, round(rng.lognormvariate(math.log(self.a), self.b)))


@functools.lru_cache(maxsize=8)
def prompts_by_domain(spec: str, domains: str = "") -> dict[str, tuple[str, ...]]:
    """domain -> its prompts, in the source's order, for the comma-separated `domains` (empty: all of
    the source's); ValueError for a domain the source does not have."""
    table: dict[str, list[str]] = {}
    for record in load_prompts(spec):
        table.setdefault(record.domain, []).append(record.prompt)
    wanted = [d.strip() for d in domains.split(",") if d.strip()] or list(table)
    unknown = [d for d in wanted if d not in table]
    if unknown:
        raise ValueError(f"domains {', '.join(unknown)}: {spec} has {', '.join(table)}")
    return {d: tuple(table[d]) for d in wanted}


@dataclass(frozen=True)
class PlannedRequest:
    endpoint: str  # "chat" | "completions"
    body: dict
    domain: str
    prompt_index: int
    max_tokens: int

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]


class Workload:
    """The request sequence of one user."""

    def __init__(self, rng: random.Random, *, prompts: dict[str, tuple[str, ...]], output_length: OutputLength,
                 endpoint: str = "chat", model: str = "", temperature: float = 0.0):
        if endpoint not in ENDPOINT_CHOICES:
            raise ValueError(f"endpoint {endpoint!r}: choose from {', '.join(ENDPOINT_CHOICES)}")
        self.rng, self.prompts, self.output_length = rng, prompts, output_length
        self.endpoint, self.model, self.temperature = endpoint, model, temperature

    def next_request(self) -> PlannedRequest:
        domain = self.rng.choice(tuple(self.prompts))
        index = self.rng.randrange(len(self.prompts[domain]))
        prompt = self.prompts[domain][index]
        max_tokens = self.output_length.sample(self.rng)
        endpoint = self.rng.choice(tuple(ENDPOINTS)) if self.endpoint == "mixed" else self.endpoint
        body: dict = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": self.temperature,
                      "stream": True, "stream_options": {"include_usage": True}}
        if self.temperature > 0:  # a sampled request is reproducible too
            body["seed"] = self.rng.randrange(2**31)
        if self.model:  # else the server's default model
            body["model"] = self.model
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return PlannedRequest(endpoint, body, domain, index, max_tokens)

"""Exact and near-duplicate matching of texts against a fixed reference set.

Exact: equal after whitespace normalisation (runs of whitespace become one space, ends trimmed).
Near: Jaccard similarity >= `threshold` (0.5) between the sets of word `n`-gram shingles (n = 5)
of the two texts, where words are the lower-cased `\\w+` runs; a text of fewer than n words has
its whole word sequence as its one shingle. Candidates are found through an inverted index from
shingle to reference, so a query costs its own shingles, not the reference set's size.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_WORD = re.compile(r"\w+")


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(word_list: list[str], n: int = 5) -> frozenset[tuple[str, ...]]:
    if len(word_list) < n:
        return frozenset([tuple(word_list)]) if word_list else frozenset()
    return frozenset(zip(*(word_list[i:] for i in range(n))))


class NearDuplicateIndex:
    def __init__(self, references: Iterable[str], *, n: int = 5, threshold: float = 0.5):
        self.n, self.threshold = n, threshold
        self.exact = set()
        self.sizes = []  # shingle count per reference
        self.index: dict[tuple[str, ...], list[int]] = {}
        for ref_id, text in enumerate(references):
            self.exact.add(normalize_whitespace(text))
            ref_shingles = shingles(words(text), n)
            self.sizes.append(len(ref_shingles))
            for s in ref_shingles:
                self.index.setdefault(s, []).append(ref_id)
        self.largest = max(self.sizes, default=0)

    def match(self, text: str) -> str | None:
        """Returns "exact", "near" or None."""
        if normalize_whitespace(text) in self.exact:
            return "exact"
        word_list = words(text)
        # Jaccard <= min(|A|, |B|) / max(|A|, |B|): a text with far more shingles than the largest
        # reference cannot be near any, and skipping it saves most of the work on long texts
        if (len(word_list) - self.n + 1) * self.threshold > self.largest:
            return None
        query = shingles(word_list, self.n)
        shared = Counter(ref_id for s in query if s in self.index for ref_id in self.index[s])
        for ref_id, common in shared.items():
            if common / (len(query) + self.sizes[ref_id] - common) >= self.threshold:
                return "near"
        return None

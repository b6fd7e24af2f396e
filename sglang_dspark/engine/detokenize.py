"""Incremental detokenization with stop strings.

Text is re-decoded from the output ids each step (outputs are short next to the model cost) and
only the settled part is released: never a trailing partial UTF-8 character, and never the last
len(longest stop) - 1 characters, which could still become a stop string.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...], skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.stop = tuple(s for s in stop if s)
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.sent = 0  # characters already released

    def update(self, output_ids: list[int], final: bool) -> tuple[str, bool]:
        """New settled text, and whether a stop string was hit (the text is cut before it)."""
        text = self.tokenizer.decode(output_ids, skip_special_tokens=self.skip_special_tokens)
        hit = False
        if self.stop:
            cut = min((i for i in (text.find(s, max(0, self.sent - self.holdback)) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                text, hit, final = text[:cut], True, True
        end = len(text)
        if not final:
            end -= self.holdback
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        new = text[self.sent : max(end, self.sent)]
        self.sent += len(new)
        return new, hit

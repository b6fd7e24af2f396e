"""From emitted tokens to what a client sees: EOS / max_tokens / stop-string cuts, settled text,
logprobs, and exactly one final output per request."""

from __future__ import annotations

from sglang_dspark.engine.detokenize import Detokenizer
from sglang_dspark.engine.request import Request, RequestOutput, TokenLogprob


class OutputProcessor:
    def __init__(self, tokenizer, eos_ids: set[int]):
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self._detok: dict[str, Detokenizer] = {}

    def commit(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> int:
        """Append emitted tokens, cut at EOS or max_tokens, stream the settled text; returns how
        many were kept. Sets req.finish_reason when the request ends (stop string, EOS, length)."""
        reason, kept = None, []
        for token in tokens:
            if token in self.eos_ids and not req.params.ignore_eos:
                reason, req.ended_on_eos = "stop", True  # EOS is not kept: the canary needs to know
                break
            kept.append(token)
            if len(req.output_ids) + len(kept) >= req.params.max_tokens:
                reason = "length"
                break
        req.tokens.extend(kept)
        detok = self._detok.get(req.id) or self._detok.setdefault(
            req.id, Detokenizer(self.tokenizer, req.params.stop, req.params.skip_special_tokens))
        text, hit = detok.update(req.output_ids, final=reason is not None)
        if hit:
            reason = "stop"
        self._emit(req, kept, text, reason, logprobs[: len(kept)] if logprobs is not None else None)
        return len(kept)

    def abort(self, req: Request) -> None:
        """End a request from outside (client gone, shutdown, failed step): its final output."""
        self._emit(req, [], "", "abort", [] if req.params.logprobs else None)

    def fail(self, req: Request, message: str) -> None:
        """End a request whose processing failed: finish_reason "abort", and `message` as its error."""
        self._emit(req, [], "", "abort", [] if req.params.logprobs else None, error=message)

    def _emit(self, req: Request, tokens: list[int], text: str, reason: str | None,
              logprobs: list[TokenLogprob] | None, error: str | None = None) -> None:
        if reason is not None:
            req.finished, req.finish_reason = True, reason
            self._detok.pop(req.id, None)
        prompt_logprobs = None
        if req.params.prompt_logprobs and not req.prompt_logprobs_sent:
            prompt_logprobs, req.prompt_logprobs_sent = req.prompt_logprobs, True
        req.callback(RequestOutput(req.id, tokens, text, reason is not None, reason, req.num_prompt,
                                   len(req.output_ids), logprobs, prompt_logprobs, error))

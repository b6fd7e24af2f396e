"""The target's token logprobs in the three wire formats: OpenAI chat, OpenAI completions and
SGLang's /generate meta_info."""

from __future__ import annotations

from sglang_dspark.engine.request import TokenLogprob


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer, items: list[TokenLogprob]) -> dict:
    """OpenAI chat `choices[].logprobs`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal"}."""
    def entry(token_id: int, logprob: float) -> dict:
        text = _piece(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [{**entry(i.token_id, i.logprob), "top_logprobs": [entry(t, lp) for t, lp in i.top]} for i in items]
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer, items: list[TokenLogprob], text_offset: int = 0) -> dict:
    """OpenAI completions `choices[].logprobs`: parallel lists tokens / token_logprobs /
    top_logprobs ({token: logprob}) / text_offset (of each token in the completion text)."""
    tokens = [_piece(tokenizer, i.token_id) for i in items]
    offsets, at = [], text_offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [i.logprob for i in items],
            "top_logprobs": [{_piece(tokenizer, t): lp for t, lp in i.top} for i in items],
            "text_offset": offsets}


def echo_logprobs(tokenizer, prompt_ids: list[int], prompt_items: list[TokenLogprob],
                  items: list[TokenLogprob] | None) -> dict:
    """Completions logprobs with `echo`: the prompt's tokens (the first has no context, so its
    logprob and alternatives are null, as OpenAI's), then the completion's `items` if any."""
    first = _piece(tokenizer, prompt_ids[0])
    rest = completion_logprobs(tokenizer, prompt_items, len(first))
    out = {"tokens": [first, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
           "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}
    if items:
        tail = completion_logprobs(tokenizer, items, len(first) + sum(len(t) for t in rest["tokens"]))
        out = {key: out[key] + tail[key] for key in out}
    return out


def _triple(tokenizer, token_id: int, logprob: float | None, with_text: bool) -> list:
    return [logprob, token_id, _piece(tokenizer, token_id) if with_text else None]


def generate_logprobs(tokenizer, items: list[TokenLogprob], top: int, with_text: bool) -> dict:
    """SGLang's meta_info fields: output_token_logprobs [(logprob, id, text|None)] and, with
    top_logprobs_num, output_top_logprobs [[(logprob, id, text|None), ...] per token]."""
    out = {"input_token_logprobs": [],
           "output_token_logprobs": [_triple(tokenizer, i.token_id, i.logprob, with_text) for i in items]}
    if top:
        out["output_top_logprobs"] = [[_triple(tokenizer, t, lp, with_text) for t, lp in i.top] for i in items]
    return out


def input_logprobs(tokenizer, prompt_ids: list[int], prompt_items: list[TokenLogprob], start: int, top: int,
                   with_text: bool) -> dict:
    """SGLang's input_token_logprobs (and input_top_logprobs) from prompt position `start` on
    (logprob_start_len); position 0 has no context, so its logprob is None, as SGLang's."""
    first = [_triple(tokenizer, prompt_ids[0], None, with_text)] if start == 0 else []
    items = prompt_items[max(start - 1, 0):]
    out = {"input_token_logprobs": first + [_triple(tokenizer, i.token_id, i.logprob, with_text) for i in items]}
    if top:
        out["input_top_logprobs"] = ([None] if start == 0 else []) + [
            [_triple(tokenizer, t, lp, with_text) for t, lp in i.top] for i in items]
    return out

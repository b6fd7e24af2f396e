"""A prompt as the token ids a chat model is given: one user turn through the model's template."""

from __future__ import annotations


def chat_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)

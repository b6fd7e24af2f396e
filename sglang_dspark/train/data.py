"""Training data: the target's own responses, and the frozen target's features over them.

Both are expensive on CPU and depend only on the target, so each is computed once and cached
on disk; every training run (DSpark and the DFlash ablation alike) reuses the same cache.

dataset-<key>.pt  {"sequences": [int64 [n]], "prompt_lens", "domains",
                  "context": [fp16 [n-1, len(layer_ids)*H]], "final": [fp16 [n-1, H]], "layer_ids"}

`context[t]` concatenates the outputs of target decoder layers `layer_ids` at position t
(transformers `hidden_states[l + 1]`); `final[t]` is the target's final normed hidden state,
from which the target's distribution at t is recovered with its lm_head during training.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_dspark.prompts import chat_ids, load_prompts


def load_target(target_dir: str | os.PathLike, dtype=torch.float32):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
    model.eval()
    return model, tokenizer


@torch.no_grad()
def generate_with_features(model, tokenizer, records, layer_ids, *, max_new_tokens, temperature,
                           batch_size, seed):
    """Sample one response per record with the target (KV-cached, batched, left padding) and
    keep the hidden states generate() already computed, so no second target pass is needed."""
    torch.manual_seed(seed)
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    out_records = {"sequences": [], "prompt_lens": [], "domains": [], "context": [], "final": []}
    for start in tqdm(range(0, len(records), batch_size), desc="generate", unit="batch"):
        batch = records[start : start + batch_size]
        prompts = [chat_ids(tokenizer, r.prompt) for r in batch]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        out = model.generate(
            input_ids=input_ids, attention_mask=attention, do_sample=True,
            temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
            pad_token_id=pad_id, eos_token_id=eos_id,
            output_hidden_states=True, return_dict_in_generate=True,
        )
        # out.hidden_states: per step, per layer [B, n, H]; the last entry is the final normed one.
        context = torch.cat(
            [torch.cat([step[l + 1] for l in layer_ids], dim=-1) for step in out.hidden_states], dim=1
        )
        final = torch.cat([step[-1] for step in out.hidden_states], dim=1)
        for i, p in enumerate(prompts):
            response = out.sequences[i, width:].tolist()
            if eos_id in response:  # keep the eos: the drafter must learn to predict it
                response = response[: response.index(eos_id) + 1]
            # Features exist for every input position, i.e. all but the last sampled token;
            # that token is only ever a label, never context.
            n = len(p) + len(response)
            lo, hi = width - len(p), width - len(p) + n - 1
            out_records["sequences"].append(torch.tensor(p + response, dtype=torch.long))
            out_records["prompt_lens"].append(len(p))
            out_records["domains"].append(batch[i].domain)
            out_records["context"].append(context[i, lo:hi].half().clone())
            out_records["final"].append(final[i, lo:hi].half().clone())
    out_records["layer_ids"] = list(layer_ids)
    return out_records


def _key(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def prepare_dataset(
    target_dir, cache_dir, layer_ids, *, max_new_tokens=160, temperature=0.8,
    batch_size=48, samples_per_prompt=1, seed=0, log=print,
):
    """Return the cached dataset for these settings, generating it on first use.

    Each training prompt is answered `samples_per_prompt` times (independent samples: every
    batch has its own seed), which multiplies the data without writing new prompts.
    Generation is saved batch by batch, so an interrupted run resumes where it stopped."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    records = load_prompts("builtin:train") * samples_per_prompt
    key = _key(target=os.path.abspath(str(target_dir)), n=len(records), max_new=max_new_tokens,
               temp=temperature, seed=seed, layers=list(layer_ids), batch=batch_size,
               samples=samples_per_prompt)
    path = cache / f"dataset-{key}.pt"
    if path.is_file():
        log(f"reusing cached dataset {path}")
        return torch.load(path)
    model = tokenizer = None
    chunks = []
    for index, start in enumerate(tqdm(range(0, len(records), batch_size), desc="data", unit="batch")):
        chunk_path = cache / f"chunk-{key}-{index}.pt"
        if not chunk_path.is_file():
            if model is None:
                model, tokenizer = load_target(target_dir)
            chunk = generate_with_features(
                model, tokenizer, records[start : start + batch_size], layer_ids,
                max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                seed=seed + index,
            )
            _atomic_save(chunk, chunk_path)
            log(f"generated batch {index + 1} -> {chunk_path}")
        chunks.append(torch.load(chunk_path))
    data = {k: [x for c in chunks for x in c[k]] for k in chunks[0] if k != "layer_ids"}
    data["layer_ids"] = list(layer_ids)
    _atomic_save(data, path)
    return data


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a concurrent reader never sees a partial file

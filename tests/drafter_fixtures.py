"""Tiny drafter factory shared by the drafter/train tests (built from a config in milliseconds)."""

from __future__ import annotations

import torch
from torch import nn

from sglang_dspark.drafter import DSparkDraftConfig, DSparkDrafter

TINY_TARGET = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_hidden_layers": 4, "vocab_size": 48, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 256, "tie_word_embeddings": True,
}


def tiny_config(**overrides) -> DSparkDraftConfig:
    dspark = dict(target_layer_ids=[0, 2], mask_token_id=3, num_hidden_layers=2, block_size=4,
                  markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True)
    dspark.update(overrides)
    return DSparkDraftConfig.from_target_config(TINY_TARGET, **dspark)


def tiny_drafter(seed: int = 0, **overrides) -> DSparkDrafter:
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    drafter = DSparkDrafter(cfg, embed, lm_head)
    if drafter.markov_head is not None:  # a zero W2 would hide Markov-path bugs
        nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)
    return drafter.eval()


SPECIALS = ["<unk>", "<s>", "</s>", "<mask>"]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant {% endif %}")


def write_tiny_model_dirs(root, max_position_embeddings: int | None = None) -> tuple[str, str]:
    """A tiny random llama target with a word-level tokenizer ("w5 w6" are tokens) and a tiny
    drafter for it, as directories on disk, the way build_engine and the launcher read them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from sglang_dspark.drafter.checkpoint import save_drafter

    # role names are words too, so the template's output tokenizes without <unk>
    words = ["user", "system", "assistant"]
    words += [f"w{i}" for i in range(TINY_TARGET["vocab_size"] - len(SPECIALS) - len(words))]
    vocab = {t: i for i, t in enumerate(SPECIALS + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", mask_token="<mask>")
    tokenizer.chat_template = CHAT_TEMPLATE
    target_dir, draft_dir = root / "target", root / "draft"
    fields = {k: v for k, v in TINY_TARGET.items() if k not in ("model_type", "architectures")}
    if max_position_embeddings is not None:
        fields["max_position_embeddings"] = max_position_embeddings
    config = LlamaConfig(**fields, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    drafter = tiny_drafter()
    save_drafter(drafter, drafter.config, draft_dir)
    return str(target_dir), str(draft_dir)

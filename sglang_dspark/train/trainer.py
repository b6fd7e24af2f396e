"""Distillation loop: teacher-forced multi-anchor blocks against the frozen target.

The target's distribution at each block slot is recovered from its cached final hidden state
with the shared lm_head (one matmul), so the target never runs during training. The loop is
deterministic for a seed (batch order and anchors come from one torch.Generator whose state is
checkpointed); only the number of steps depends on the wall-clock budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_dspark.drafter import DSparkDrafter
from sglang_dspark.train.batches import make_batch
from sglang_dspark.train.losses import dspark_loss

STATE_NAME = "trainer_state.pt"


@dataclass
class LoopConfig:
    seed: int = 0
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    seqs_per_step: int = 2
    anchors_per_seq: int = 32
    max_steps: int | None = None  # None: run until the time budget is spent
    time_budget_s: float | None = None
    save_every_s: float = 120.0
    grad_clip: float = 1.0


class Trainer:
    def __init__(self, drafter: DSparkDrafter, data: dict, loop: LoopConfig, state_dir=None,
                 on_checkpoint=None):
        self.drafter = drafter
        self.data = data
        self.loop = loop
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.on_checkpoint = on_checkpoint  # called after each state save (e.g. export weights)
        params = [p for p in drafter.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(params, lr=loop.lr, weight_decay=loop.weight_decay)
        self.generator = torch.Generator().manual_seed(loop.seed)
        self.step = 0
        self.elapsed_s = 0.0
        self.order: list[int] = []
        self.history: list[dict] = []

    # ---- resumable state --------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"model": self.drafter.state_dict(), "optim": self.optim.state_dict(),
                "step": self.step, "elapsed_s": self.elapsed_s, "order": self.order,
                "rng": self.generator.get_state(), "history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.drafter.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.step, self.elapsed_s = state["step"], state["elapsed_s"]
        self.order, self.history = list(state["order"]), list(state["history"])
        self.generator.set_state(state["rng"])

    def try_resume(self) -> bool:
        path = self.state_dir / STATE_NAME if self.state_dir else None
        if path is None or not path.is_file():
            return False
        self.load_state_dict(torch.load(path, weights_only=False))
        return True

    def save(self) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (STATE_NAME + ".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(self.state_dir / STATE_NAME)
        if self.on_checkpoint is not None:
            self.on_checkpoint(self)

    # ---- training -----------------------------------------------------------------------------

    def _next_indices(self) -> list[int]:
        want = self.loop.seqs_per_step
        while len(self.order) < want:  # a fresh shuffled epoch
            n = len(self.data["sequences"])
            self.order += torch.randperm(n, generator=self.generator).tolist()
        chosen, self.order = self.order[:want], self.order[want:]
        return chosen

    def _lr(self) -> float:
        return self.loop.lr * min(1.0, (self.step + 1) / max(self.loop.warmup_steps, 1))

    def train_step(self) -> dict:
        self.drafter.train()
        batch = make_batch(self.data, self._next_indices(), self.loop.anchors_per_seq,
                           self.drafter.gamma, self.generator)
        with torch.no_grad():
            target_logits = batch.target_final @ self.drafter.lm_head_weight.T
            target_probs = torch.softmax(target_logits.float(), dim=-1)
        out = self.drafter.forward_train(batch.input_ids, batch.context, batch.anchor_pos,
                                         batch.anchor_valid)
        loss = dspark_loss(out.logits, out.conf_logits, target_probs, batch.labels, batch.valid)
        for group in self.optim.param_groups:
            group["lr"] = self._lr()
        self.optim.zero_grad(set_to_none=True)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.loop.grad_clip)
        self.optim.step()
        self.step += 1
        return {"step": self.step, "loss": float(loss.total.detach()), "ce": float(loss.ce),
                "l1": float(loss.l1), "conf": float(loss.conf), "accept": float(loss.accept),
                "positions": batch.num_positions}

    def _done(self) -> bool:
        if self.loop.max_steps is not None and self.step >= self.loop.max_steps:
            return True
        return self.loop.time_budget_s is not None and self.elapsed_s >= self.loop.time_budget_s

    def run(self, progress: bool = True) -> list[dict]:
        total = self.loop.max_steps
        bar = tqdm(total=total, initial=self.step, unit="step", disable=not progress,
                   dynamic_ncols=True)
        last_save = time.monotonic()
        ema = None
        while not self._done():
            t0 = time.monotonic()
            stats = self.train_step()
            dt = time.monotonic() - t0
            self.elapsed_s += dt
            stats["elapsed_s"] = round(self.elapsed_s, 2)
            self.history.append(stats)
            ema = stats["loss"] if ema is None else 0.95 * ema + 0.05 * stats["loss"]
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", accept=f"{stats['accept']:.3f}",
                            tok_s=f"{stats['positions'] / max(dt, 1e-9):.0f}",
                            left_min=self._minutes_left())
            if time.monotonic() - last_save >= self.loop.save_every_s:
                self.save()
                last_save = time.monotonic()
        bar.close()
        self.save()
        return self.history

    def _minutes_left(self) -> str:
        if self.loop.time_budget_s is None:
            return "-"
        return f"{max(self.loop.time_budget_s - self.elapsed_s, 0) / 60:.1f}"


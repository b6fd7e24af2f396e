"""Distillation loop: teacher-forced multi-anchor blocks against the frozen target.

The target never runs during training: its distribution at each block slot is recovered from the
stored final hidden state and log-normaliser over the drafter's hot vocabulary (train/hot_vocab.py),
or over the whole vocabulary without one. Batch order and anchors come from one torch.Generator
whose state is checkpointed, so a run is deterministic per step and resumes exactly; only the
number of steps depends on the wall-clock budget (and, with a time budget, the learning-rate
schedule, which follows the share of the budget spent).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_dspark.drafter import DSparkDrafter
from sglang_dspark.train.batches import FeatureLayout, make_batch
from sglang_dspark.train.heldout import HeldoutEstimator
from sglang_dspark.train.hot_vocab import hot_vocabulary, target_probs, vocab_index
from sglang_dspark.train.losses import dspark_loss, kl_loss

STATE_NAME = "trainer_state.pt"


@dataclass
class LoopConfig:
    seed: int = 0
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decay to this share of lr over the run (1.0: constant)
    weight_decay: float = 0.0
    seqs_per_step: int = 2
    anchors_per_seq: int = 32
    max_steps: int | None = None  # None: run until the time budget is spent
    time_budget_s: float | None = None
    save_every_s: float = 120.0
    eval_every_s: float = 300.0  # held-out estimate interval (needs a held-out store)
    grad_clip: float = 1.0
    bf16: bool = False  # CPU autocast to bfloat16 for the matmuls
    objective: str = "dspark"  # train/losses.py: "dspark" (the paper's) or "kl"
    # curriculum: for the first `recent_context_s` seconds of training a block sees only the last
    # `recent_context` context positions, so its first position learns to read the target's state h_t
    # (attention over hundreds of positions found it slowly: a drafter trailed a linear probe of
    # [h_t; E(x_t+1)]); then the whole context, as inference sees it
    recent_context: int = 1
    recent_context_s: float = 0.0


class Trainer:
    def __init__(self, drafter: DSparkDrafter, store, loop: LoopConfig, state_dir=None, on_checkpoint=None,
                 hot_ids: torch.Tensor | None = None, heldout=None, log=print):
        self.drafter = drafter
        self.store = store
        self.loop = loop
        self.layout = FeatureLayout.of(store.layer_ids, drafter.config.target_layer_ids, drafter.config.hidden_size)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.on_checkpoint = on_checkpoint  # called after each state save (e.g. export weights)
        self.hot_ids = hot_ids
        self.hot_lm_head = drafter.lm_head_weight[hot_ids] if hot_ids is not None else None
        self.label_index = vocab_index(hot_ids, drafter.config.vocab_size) if hot_ids is not None else None
        self.heldout = HeldoutEstimator(self, heldout) if heldout is not None else None
        self.log = log
        params = [p for p in drafter.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(params, lr=loop.lr, weight_decay=loop.weight_decay)
        self.generator = torch.Generator().manual_seed(loop.seed)
        self.step = 0
        self.elapsed_s = 0.0
        self.order: list[int] = []
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.checks: list[dict] = []  # measured tau of exported checkpoints (train/__main__.py)

    # ---- resumable state --------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"model": self.drafter.state_dict(), "optim": self.optim.state_dict(),
                "step": self.step, "elapsed_s": self.elapsed_s, "order": self.order,
                "rng": self.generator.get_state(), "history": self.history, "evals": self.evals,
                "checks": self.checks}

    def load_state_dict(self, state: dict) -> None:
        self.drafter.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.step, self.elapsed_s = state["step"], state["elapsed_s"]
        self.order, self.history = list(state["order"]), list(state["history"])
        self.evals, self.checks = list(state.get("evals", [])), list(state.get("checks", []))
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

    # ---- one step -----------------------------------------------------------------------------

    def _next_indices(self) -> list[int]:
        want = self.loop.seqs_per_step
        while len(self.order) < want:  # a fresh shuffled epoch
            self.order += torch.randperm(len(self.store), generator=self.generator).tolist()
        chosen, self.order = self.order[:want], self.order[want:]
        return chosen

    def _lr(self) -> float:
        loop = self.loop
        warm = min(1.0, (self.step + 1) / max(loop.warmup_steps, 1))
        if loop.max_steps is not None:
            done = self.step / max(loop.max_steps, 1)
        elif loop.time_budget_s:
            done = self.elapsed_s / loop.time_budget_s
        else:
            done = 0.0
        decay = loop.min_lr_ratio + (1 - loop.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        return loop.lr * warm * decay

    def forward(self, batch, context_window: int | None = None):
        """(draft logits, conf logits, target probs, outside mass, labels) over the training
        vocabulary (the hot one, or the whole)."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.loop.bf16), \
                hot_vocabulary(self.drafter, self.hot_ids, self.hot_lm_head):
            out = self.drafter.forward_train(batch.input_ids, batch.context, batch.anchor_pos, batch.anchor_valid,
                                             context_window)
        with torch.no_grad():
            if self.hot_ids is None:
                probs, outside = target_probs(batch.target_final, self.drafter.lm_head_weight, None)
                labels = batch.labels
            else:
                probs, outside = target_probs(batch.target_final, self.hot_lm_head, batch.lse)
                labels = self.label_index[batch.labels]
        return out.logits.float(), out.conf_logits.float(), probs, outside, labels

    def make_batch(self, store, indices, generator, anchors: int | None = None):
        return make_batch(store, indices, anchors or self.loop.anchors_per_seq, self.drafter.gamma, generator,
                          self.layout)

    def train_step(self) -> dict:
        self.drafter.train()
        batch = self.make_batch(self.store, self._next_indices(), self.generator)
        window = self.loop.recent_context if self.elapsed_s < self.loop.recent_context_s else None
        logits, conf, probs, outside, labels = self.forward(batch, window)
        if self.loop.objective == "kl":
            argmax = batch.target_argmax if self.label_index is None else self.label_index[batch.target_argmax]
            loss = kl_loss(logits, conf, probs, argmax, batch.valid, outside)
        else:
            loss = dspark_loss(logits, conf, probs, labels, batch.valid, outside)
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

    # ---- the loop -----------------------------------------------------------------------------

    def done(self) -> bool:
        if self.loop.max_steps is not None and self.step >= self.loop.max_steps:
            return True
        return self.loop.time_budget_s is not None and self.elapsed_s >= self.loop.time_budget_s

    def evaluate_heldout(self) -> dict | None:
        if self.heldout is None:
            return None
        result = {"step": self.step, "elapsed_s": round(self.elapsed_s, 1), **self.heldout.estimate()}
        self.evals.append(result)
        self.log(f"held-out step {self.step} ({self.elapsed_s / 60:.1f} min): tau~ T=0 {result['tau_t0']:.3f}, "
                 f"T=1 {result['tau_t1']:.3f}; acceptance per position "
                 + " ".join(f"{a:.2f}" for a in result["accept_per_position"]))
        return result

    def run(self, progress: bool = True) -> list[dict]:
        by_time = self.loop.max_steps is None and self.loop.time_budget_s is not None
        total = round(self.loop.time_budget_s) if by_time else self.loop.max_steps
        # by time: the bar counts seconds of the budget, so its ETA is the end of the run
        bar = tqdm(total=total, initial=round(self.elapsed_s) if by_time else self.step,
                   unit="s" if by_time else "step", disable=not progress, dynamic_ncols=True, mininterval=2.0,
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]" if by_time else None)
        last_save = last_eval = time.monotonic()
        if not self.evals:
            self.evaluate_heldout()
        ema = None
        while not self.done():
            t0 = time.monotonic()
            stats = self.train_step()
            if time.monotonic() - last_eval >= self.loop.eval_every_s:
                self.evaluate_heldout()
                last_eval = time.monotonic()
            dt = time.monotonic() - t0
            self.elapsed_s += dt
            stats["elapsed_s"] = round(self.elapsed_s, 2)
            self.history.append(stats)
            ema = stats["loss"] if ema is None else 0.98 * ema + 0.02 * stats["loss"]
            # never past the total: tqdm then drops it and the bar's "{total:.0f}" cannot format
            bar.update(min(dt, max(0.0, total - bar.n)) if by_time else 1)
            bar.set_postfix(step=self.step, loss=f"{ema:.3f}", accept=f"{stats['accept']:.3f}",
                            pos_s=f"{stats['positions'] / max(dt, 1e-9):.0f}", refresh=False)
            if time.monotonic() - last_save >= self.loop.save_every_s:
                self.save()
                last_save = time.monotonic()
        bar.close()
        if self.evals and self.evals[-1]["step"] != self.step:
            self.evaluate_heldout()
        self.save()
        return self.history

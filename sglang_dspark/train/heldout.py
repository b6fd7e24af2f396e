"""A quick held-out tau estimate while training, from teacher-forced blocks of held-out sequences.

Per block position k the analytic acceptance of rejection sampling is a_k = 1 - 0.5 ||q_k - p_k||_1
(exact over a hot vocabulary, see train/losses.py), and greedy decoding accepts draft k when its
argmax is the target's. Treating a block's positions as one chain,

    tau(T=1) ~ 1 + sum_k prod_{j<=k} a_j         tau(T=0) ~ 1 + sum_k prod_{j<=k} [argmax match_j]

averaged over blocks that fit inside their sequence. Teacher forcing feeds the true previous tokens
to the Markov head, where real decoding feeds the drafter's own: an estimate for comparing runs and
checkpoints, not a measured tau (`python -m sglang_dspark.evaluate` measures that).
"""

from __future__ import annotations

import torch

from sglang_dspark.train.losses import acceptance

HELDOUT_SEQUENCES = 48
HELDOUT_ANCHORS = 16
HELDOUT_BATCH = 4


class HeldoutEstimator:
    def __init__(self, trainer, store, sequences: int = HELDOUT_SEQUENCES, seed: int = 1234):
        self.trainer, self.store, self.seed = trainer, store, seed
        self.indices = list(range(min(sequences, len(store))))

    @torch.no_grad()
    def estimate(self) -> dict:
        trainer = self.trainer
        drafter = trainer.drafter
        was_training = drafter.training
        drafter.eval()
        generator = torch.Generator().manual_seed(self.seed)  # the same blocks at every call
        accepts, matches = [], []
        for start in range(0, len(self.indices), HELDOUT_BATCH):
            batch = trainer.make_batch(self.store, self.indices[start : start + HELDOUT_BATCH], generator,
                                       anchors=HELDOUT_ANCHORS)
            logits, _, probs, outside, _ = trainer.forward(batch)
            _, accept = acceptance(torch.log_softmax(logits, -1), probs, outside)
            drafted = logits.argmax(-1)
            if trainer.hot_ids is not None:
                drafted = trainer.hot_ids[drafted]
            full = batch.valid.all(-1)  # blocks that fit inside their sequence
            accepts.append(accept[full])
            matches.append((drafted == batch.target_argmax)[full].float())
        drafter.train(was_training)
        accept, match = torch.cat(accepts), torch.cat(matches)
        return {"tau_t1": float(1 + accept.cumprod(-1).sum(-1).mean()),
                "tau_t0": float(1 + match.cumprod(-1).sum(-1).mean()),
                "accept_per_position": accept.mean(0).tolist(), "greedy_match_per_position": match.mean(0).tolist(),
                "blocks": int(accept.shape[0])}

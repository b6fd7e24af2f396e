"""What `DSparkDrafter.draft` asks of an inference backend attached as `drafter.rows`: the row-kernel
path (engine/draft_rows.py `DraftRows`, which the engine attaches where the CPU row kernels serve
the drafter) implements it; with `rows` None the drafter's own modules run the same arithmetic.

Declared here, in drafter/, so that the drafter's dependency on the engine's object is visible and
checked (tests/test_architecture.py: every call the drafter makes on `rows` is a method of this
protocol, and `DraftRows` implements each with the same parameters), while drafter/ still imports
nothing from engine/.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class DraftBackend(Protocol):
    def vocab_changed(self, drafter) -> None:
        """The drafter's draft vocabulary changed: repack what depends on it."""

    def store_context(self, kv: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor) -> None:
        """Project target features hidden [n, m*H] into every layer's K/V at (slots, positions)."""

    def backbone(self, kv: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 keys: torch.Tensor) -> torch.Tensor:
        """Final normed hidden [T, H] of the embedded block rows x [T, H]."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits [T, V or S] (float32) over the draft vocabulary."""

    def confidence(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None) -> torch.Tensor:
        """Raw confidence logits [..., G] (float32)."""

    def markov_bias(self, features: torch.Tensor) -> torch.Tensor:
        """The Markov head's bias [R, V or S] (float32) from its step features."""

    def greedy_chain(self, base: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor | None:
        """Every position's argmax draft [R, G] at once, or None where the head needs the loop."""

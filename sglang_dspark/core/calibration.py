"""Confidence calibration: Sequential Temperature Scaling (STS), ECE and AUROC.

The scheduler multiplies per-position confidences into survival probabilities, so it needs them
calibrated in absolute terms. STS fits one temperature per position, left to right, each chosen to
minimise the ECE of the cumulative product against "prefix of length k+1 accepted", with earlier
temperatures frozen (docs/ALGORITHM.md, calibration). Dividing a logit by T > 0 keeps the ranking.

The STS file is SGLang's `DSparkStsCalibration` JSON, field for field.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import field_validator

from sglang_dspark.core.schema import StrictModel

DEFAULT_GRID = torch.logspace(-1.5, 1.5, 121, dtype=torch.float64)  # T in [0.03, 32]


class StsCalibration(StrictModel):
    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = []
    ece_after: list[float] = []

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, temperatures: list[float]) -> list[float]:
        if not temperatures:
            raise ValueError("at least one temperature is required")
        if any(not t > 0 for t in temperatures):
            raise ValueError(f"every value must be > 0, got {temperatures}")
        return temperatures

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> StsCalibration:
        return cls.model_validate_json(text)

    @classmethod
    def load(cls, path: str | Path) -> StsCalibration:
        return cls.from_json(Path(path).read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())


def apply_sts(conf_logits: torch.Tensor, temperatures: torch.Tensor | None) -> torch.Tensor:
    """Conditional survival c = sigmoid(z / T) per position; T = None means uncalibrated. A block cut
    short (fewer positions than temperatures) takes the temperatures of its positions."""
    if temperatures is None:
        return torch.sigmoid(conf_logits.float())
    temperatures = temperatures[..., : conf_logits.shape[-1]]
    return torch.sigmoid(conf_logits.float() / temperatures.to(conf_logits.device, torch.float32))


def prefix_labels(accept_len: torch.Tensor, gamma: int) -> torch.Tensor:
    """label[n, k] = 1 when the first k+1 drafts of sample n were accepted."""
    return (torch.arange(gamma).unsqueeze(0) < accept_len.unsqueeze(1)).to(torch.float64)


def _ece_batched(pred: torch.Tensor, label: torch.Tensor, bins: int) -> torch.Tensor:
    """ECE of each row of pred [M, N] against label [N]: equal-width bins, count-weighted."""
    pred = pred.to(torch.float64)
    idx = (pred * bins).long().clamp_(0, bins - 1)
    offsets = (torch.arange(pred.shape[0]) * bins).unsqueeze(1)
    flat = (idx + offsets).reshape(-1)
    size = pred.shape[0] * bins
    count = torch.bincount(flat, minlength=size).to(torch.float64)
    sum_pred = torch.bincount(flat, weights=pred.reshape(-1), minlength=size)
    sum_label = torch.bincount(flat, weights=label.to(torch.float64).expand_as(pred).reshape(-1), minlength=size)
    # sum over bins of (n_b / N) * |mean_pred_b - mean_label_b| = |sum_pred_b - sum_label_b| / N
    gap = (sum_pred - sum_label).abs().view(pred.shape[0], bins).sum(1)
    return gap / count.view(pred.shape[0], bins).sum(1).clamp(min=1)


def _nll_batched(pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Mean binary log loss of each row of pred [M, N] against label [N]."""
    pred = pred.to(torch.float64).clamp(1e-12, 1 - 1e-12)
    label = label.to(torch.float64)
    return -(label * pred.log() + (1 - label) * (1 - pred).log()).mean(dim=1)


# What each position's temperature minimises: the paper's ECE, or the log loss (a proper scoring
# rule: no binning, so less prone to chase the noise of a small calibration split).
OBJECTIVES = ("ece", "nll")


def ece(pred: torch.Tensor, label: torch.Tensor, bins: int = 20) -> float:
    """Expected calibration error with `bins` equal-width bins (DeepSpec's evaluator)."""
    return float(_ece_batched(pred.reshape(1, -1), label.reshape(-1), bins)[0])


def auroc(pred: torch.Tensor, label: torch.Tensor) -> float:
    """Exact area under the ROC curve (Mann-Whitney U with average ranks for ties); NaN if one class."""
    pred = pred.reshape(-1).to(torch.float64)
    label = label.reshape(-1).bool()
    n_pos = int(label.sum())
    n_neg = label.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    values, order = torch.sort(pred)
    _, inverse, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    last_rank = torch.cumsum(counts, 0).to(torch.float64)
    avg_rank = last_rank - (counts.to(torch.float64) - 1) / 2  # 1-based mean rank of each tie group
    ranks = torch.empty_like(pred)
    ranks[order] = avg_rank[inverse]
    u = ranks[label].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def cumulative_survival(conf_logits: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    return torch.cumprod(apply_sts(conf_logits, temperatures).to(torch.float64), dim=1)


def fit_sts(
    conf_logits: torch.Tensor,
    accept_len: torch.Tensor,
    *,
    grid: torch.Tensor = DEFAULT_GRID,
    bins: int = 20,
    objective: str = "ece",
    min_positives: int = 20,
) -> torch.Tensor:
    """Per-position temperatures [G] fitted left to right on held-out (conf_logits [N, G], accept_len [N]).

    accept_len must come from full-block verification, so every position's label is observed.
    `objective` is what each temperature minimises over the grid: "ece" (the paper's) or "nll".
    A position whose labels hold fewer than `min_positives` accepted prefixes (or fewer than that
    many rejected ones) keeps the previous position's temperature (1 at the first): a rate cannot be
    calibrated from a handful of events, and with none at all either objective drives the
    prediction to 0, the grid's smallest temperature.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    z = conf_logits.to(torch.float64)
    labels = prefix_labels(accept_len, z.shape[1])
    temperatures = torch.ones(z.shape[1], dtype=torch.float64)
    survival = torch.ones(z.shape[0], dtype=torch.float64)
    for k in range(z.shape[1]):
        positives = int(labels[:, k].sum())
        if min(positives, z.shape[0] - positives) < min_positives:
            temperatures[k] = temperatures[k - 1] if k else 1.0
            survival = survival * torch.sigmoid(z[:, k] / temperatures[k])
            continue
        candidates = survival.unsqueeze(0) * torch.sigmoid(z[:, k].unsqueeze(0) / grid.unsqueeze(1))
        loss = (_ece_batched(candidates, labels[:, k], bins) if objective == "ece"
                else _nll_batched(candidates, labels[:, k]))
        best = int(torch.argmin(loss))
        temperatures[k] = grid[best]
        survival = candidates[best]
    return temperatures.to(torch.float32)


def calibration_report(
    conf_logits: torch.Tensor, accept_len: torch.Tensor, temperatures: torch.Tensor, bins: int = 20
) -> dict[str, list[float]]:
    """Per-position cumulative ECE and AUROC before and after STS."""
    labels = prefix_labels(accept_len, conf_logits.shape[1])
    before = cumulative_survival(conf_logits)
    after = cumulative_survival(conf_logits, temperatures)
    cols = range(conf_logits.shape[1])
    return {
        "ece_before": [ece(before[:, k], labels[:, k], bins) for k in cols],
        "ece_after": [ece(after[:, k], labels[:, k], bins) for k in cols],
        "auroc_before": [auroc(before[:, k], labels[:, k]) for k in cols],
        "auroc_after": [auroc(after[:, k], labels[:, k]) for k in cols],
    }

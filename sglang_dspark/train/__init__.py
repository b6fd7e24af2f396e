"""Distillation trainer for the DSpark drafter and its data pipeline."""

SUMMARY_NAME = "train_summary.json"  # what a training run records next to the drafter it wrote
CURVE_NAME = "tau_curve.png"  # the held-out curve redrawn at every checkpoint (train/curve.py)

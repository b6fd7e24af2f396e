"""Distillation trainer for the DSpark drafter and its data pipeline."""

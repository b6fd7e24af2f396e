"""The weight formats' names, without torch: command lines list them in --help, which must not wait
for torch to import (engine/cpu/formats.py says what each one is)."""

WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "int4")
FORMAT_CHOICES = ("auto",) + WEIGHT_FORMATS

"""sglang-dspark: a deployment bundle for DSpark speculative decoding on SGLang."""

__version__ = "0.1.0"

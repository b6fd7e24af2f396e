"""Build, check and export SLA profiles (`python -m sglang_dspark.profile --help`).

- `validate FILE [--model DIR --draft DIR]`: schema + semantic checks, optionally the fingerprint.
- `export FILE --out DIR`: SGLang's JSON files for `--speculative-dspark-sps-table-path` and
  `--speculative-dspark-confidence-sts-path`.
- `capture-http --base-url URL`: measure a running SGLang-compatible server over HTTP.
- `capture` (in-process, reference engine): `sglang_dspark.profile.capture`, when present.

The schema itself is `sglang_dspark.profiles`.
"""

from sglang_dspark.profiles import ProfileError, SlaProfile  # noqa: F401

"""SLA profiles: the schema (schema.py), fingerprints (fingerprint.py), the shared summary and fit
of measured steps (measure.py), capture in process (capture.py) or over HTTP (http_capture.py),
launch-time resolution (resolve.py), plots (plot.py) and the CLI (cli.py)."""

from sglang_dspark.profile.schema import ProfileError, SlaProfile, SlaTier

__all__ = ["ProfileError", "SlaProfile", "SlaTier"]

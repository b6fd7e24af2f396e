"""`validate`: a profile's schema and semantics, and (given the model directories) its fingerprint."""

from __future__ import annotations

from pathlib import Path

from sglang_dspark.profiles import ProfileError, SlaProfile, check_fingerprint


def validate_file(path: str | Path, *, model: str | None = None, draft: str | None = None,
                  engine: str | None = None, force: bool = False) -> tuple[SlaProfile, list[str]]:
    """(profile, fingerprint mismatches). Loading errors raise ProfileError; with `model` / `draft`
    the fingerprint is checked (content hashes; gamma from the drafter's config; hardware; library
    versions; `engine` when given) and a mismatch raises ProfileError too unless `force`, which
    returns the mismatches instead."""
    profile = SlaProfile.load(path)
    if model is None and draft is None:
        return profile, []
    lines = check_fingerprint(profile, engine=engine or profile.fingerprint.engine,
                              target_dir=model, draft_dir=draft,
                              tp=profile.fingerprint.tp, dp=profile.fingerprint.dp)
    if model is None:  # only what was given is compared
        lines = [l for l in lines if not l.startswith("target_sha256:")]
    if draft is None:
        lines = [l for l in lines if not l.startswith(("draft_sha256:", "gamma:"))]
    if lines and not force:
        raise ProfileError(f"{path}: fingerprint does not match: {'; '.join(lines)}")
    return profile, lines

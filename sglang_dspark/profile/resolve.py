"""`launch --profile FILE`: load one SLA profile and check it belongs to this deployment.

The profile's fingerprint (engine, hardware, library versions, content hashes of the target and
drafter, gamma) must match what is about to be launched; a mismatch is refused with one line
listing every difference, unless forced (then it is only logged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_dspark.profile.fingerprint import check, require_match
from sglang_dspark.profile.schema import ProfileError, SlaProfile, SlaTier


@dataclass(frozen=True)
class LaunchProfile:
    path: str
    profile: SlaProfile
    tier: SlaTier | None = None
    mismatches: list[str] = field(default_factory=list)  # non-empty when forced, or when only a seed
    seed_only: bool = False  # measured on other hardware: its times are scaled to this host's steps

    def describe(self) -> str:
        tier = f" tier={self.tier.name} ({self.tier.tok_s_per_user} tok/s/user)" if self.tier else ""
        if self.seed_only:
            return f"{self.path} ({self.profile.name}){tier} as a seed (measured elsewhere: {'; '.join(self.mismatches)})"
        forced = f" FORCED despite: {'; '.join(self.mismatches)}" if self.mismatches else ""
        return f"{self.path} ({self.profile.name}){tier}{forced}"


def only_hardware_differs(lines: list[str]) -> bool:
    """The differences are the machine, library versions and weight format, not the engine, models,
    gamma or parallelism: the table's shape still describes this deployment, only its scale may not."""
    return bool(lines) and all(line.startswith(("hardware:", "version ", "weight_format:")) for line in lines)


def resolve_profile(path: str, *, engine: str, model: str, draft: str | None, force: bool = False,
                    tier: str | None = None, tp: int = 1, dp: int = 1, seed_ok: bool = False,
                    weight_format: str | None = None) -> LaunchProfile:
    """Load `path`, check its fingerprint against `engine` / `model` / `draft` and this machine, and
    pick `tier`. ProfileError (one line) on any problem; with `force` a fingerprint mismatch is a
    logged warning instead; with `seed_ok` a profile that differs only in hardware and library
    versions is accepted as a seed for the online SPS estimator."""
    profile = SlaProfile.load(path)
    try:
        chosen = profile.tier(tier) if tier is not None else None
    except ProfileError as exc:
        raise ProfileError(f"{path}: --sla-tier {tier}: {exc}") from None
    lines = check(profile, engine=engine, target_dir=model, draft_dir=draft, tp=tp, dp=dp, weight_format=weight_format)
    if seed_ok and not force and only_hardware_differs(lines):
        return LaunchProfile(str(path), profile, chosen, lines, seed_only=True)
    require_match(path, lines, force=force, hint=" this launch (--force-profile to use it anyway)")
    return LaunchProfile(str(path), profile, chosen, lines)

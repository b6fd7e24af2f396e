"""The base of every file format in the bundle: frozen pydantic models with one-line errors.

SGLang's own SPS and STS files are msgspec structs; ours read and write the same JSON, field for
field (tests/test_sglang_parity.py decodes our files with SGLang's structs). pydantic reports
where each error is, so a bad file becomes `<a.b[2].field>: <reason>` on one line.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class StrictModel(BaseModel):
    """Immutable and strict: a string where a number belongs is an error (never coerced), and so is
    an unknown key (a misspelt optional field must not pass silently). SGLang's SPS and STS files
    hold exactly the fields of their structs, so they pass too."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class FieldError(ValueError):
    """A check across fields that blames one of them; `error_line` puts it on that field's path."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def error_line(exc: ValidationError) -> str:
    """The first error as `a.b[2].field: reason`, on one line."""
    err = exc.errors(include_url=False)[0]
    loc, reason = list(err["loc"]), err["msg"].removeprefix("Value error, ")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc, reason = loc + [cause.field], cause.reason
    elif err["type"] == "extra_forbidden":
        reason = "unknown field"
    elif err["type"] == "missing":
        reason = "missing required field"
    elif err["type"].endswith("_type"):
        reason = f"{reason}, got {type(err['input']).__name__} {err['input']!r}"
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return " ".join((f"{path}: {reason}" if path else reason).split())

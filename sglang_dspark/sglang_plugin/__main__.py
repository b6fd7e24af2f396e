"""`python -m sglang_dspark.sglang_plugin`: will SGLang load the plugin here? Checks the installed
SGLang version, every hook target, the entry point, and `SGLANG_PLUGINS` when it is set; prints one
line per check and exits 1 when the plugin would not register (SGLang then runs without it)."""

from __future__ import annotations

import os
import sys
import warnings
from importlib import metadata

from sglang_dspark.help_format import DefaultsHelpFormatter, OneLineErrorParser
from sglang_dspark.sglang_plugin import check, register, targets

ENTRY_POINT_GROUP = "sglang.srt.plugins"
NAME = "sglang_dspark"


def main(argv: list[str] | None = None) -> int:
    OneLineErrorParser(prog="python -m sglang_dspark.sglang_plugin", description=__doc__.split("\n\n")[0],
                       formatter_class=DefaultsHelpFormatter).parse_args(argv)
    problems = []
    warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")  # "no CUDA here" notes on import
    reason = check()
    if reason is None:
        print(f"sglang {metadata.version('sglang')}: all {len(targets.HOOKED) + len(targets.READ)} hook targets found")
    else:
        problems.append(reason)
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == NAME]
    if not found:
        problems.append(f"entry point {ENTRY_POINT_GROUP}:{NAME} is not installed in {sys.executable} (pip install "
                        "the bundle into the interpreter that runs SGLang)")
    else:
        try:
            loaded = found[0].load()  # what SGLang's loader calls
        except Exception as exc:  # noqa: BLE001 - any failure to load is the reason to report
            problems.append(f"entry point {ENTRY_POINT_GROUP}:{NAME} = {found[0].value} does not load "
                            f"({type(exc).__name__}: {exc})")
        else:
            if loaded is not register:
                problems.append(f"entry point {ENTRY_POINT_GROUP}:{NAME} = {found[0].value} is not this bundle's "
                                "register()")
            else:
                print(f"entry point {ENTRY_POINT_GROUP}:{NAME} installed")
    allow = os.environ.get("SGLANG_PLUGINS")
    if allow is not None and NAME not in [p.strip() for p in allow.split(",")]:
        problems.append(f"SGLANG_PLUGINS={allow!r} does not list {NAME}, so SGLang skips it")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print("the plugin registers its hooks in every SGLang process")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

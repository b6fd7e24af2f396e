"""Load tests at tok/s/user tiers for OpenAI-compatible servers (the reference server, SGLang, sglang-router).

    python -m sglang_dspark.loadtest run --host http://127.0.0.1:30000 --users 1,4,16 --duration 30s \\
        --profile sla_profiles/smollm2-135m-instruct-cpu.yaml --gate interactive --out runs/scheduled
    python -m sglang_dspark.loadtest report runs/target runs/scheduled --out runs/compare

Bad input is one line on stderr, `error: <reason>`, exit status 2; a failed gate is one line, exit 1.
"""

from __future__ import annotations

import argparse
import sys

from sglang_dspark.help_format import EXIT_BAD_INPUT, OneLineErrorParser
from sglang_dspark.loadtest.report import add_report_parser
from sglang_dspark.loadtest.run import RunFailed, add_run_parser

EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="python -m sglang_dspark.loadtest", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_parser(subparsers)
    add_report_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

"""SLA profiles: validate, export to SGLang, capture.

    python -m sglang_dspark.profile validate PROFILE.yaml [--model DIR --draft DIR]
    python -m sglang_dspark.profile export PROFILE.yaml --out DIR
    python -m sglang_dspark.profile refit PROFILE.yaml [--out NEW.yaml]
    python -m sglang_dspark.profile set-sts PROFILE.yaml (--sts STS.json | --clear) [--out NEW.yaml]
    python -m sglang_dspark.profile capture-http --base-url http://127.0.0.1:30000 --out PROFILE.yaml

Errors are one line on stderr, `error: <file>: <reason naming the field>`, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import msgspec

from sglang_dspark.profiles import ProfileError, SlaProfile

EXIT_ERROR = 2


def _add_validate(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="check a profile (schema, semantics, and with --model/--draft its fingerprint)",
        description="Exit 0 with a one-line summary for a valid profile; exit 2 with one line naming the field "
                    "otherwise.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--model", metavar="DIR", help="target model directory: check its content hash, the hardware and "
                                                  "library versions against the fingerprint")
    p.add_argument("--draft", metavar="DIR", help="drafter directory: check its content hash and gamma (its config's "
                                                  "block_size) against the fingerprint")
    p.add_argument("--engine", choices=("reference", "sglang"),
                   help="also require the profile to be for this engine (default: not checked)")
    p.set_defaults(func=_run_validate)


def _run_validate(args) -> int:
    from sglang_dspark.profile.validate import validate_file

    profile, _ = validate_file(args.file, model=args.model, draft=args.draft, engine=args.engine)
    checked = " (fingerprint matches)" if args.model or args.draft else ""
    print(f"ok {args.file}: {profile.summary()}{checked}")
    return 0


def _add_export(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write SGLang's SPS table and STS JSON files from a profile",
        description="Writes sps_table.json (the additive table when the profile has one, else the cost table) "
                    "and sts_calibration.json (when the profile has STS), for SGLang's "
                    "--speculative-dspark-sps-table-path and --speculative-dspark-confidence-sts-path.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the JSON files into")
    p.set_defaults(func=_run_export)


def _run_export(args) -> int:
    profile = SlaProfile.load(args.file)
    sps, sts = profile.export_sglang(args.out)
    print(f"--speculative-dspark-sps-table-path {sps}")
    if sts is not None:
        print(f"--speculative-dspark-confidence-sts-path {sts}")
    return 0


def _add_refit(subparsers) -> None:
    p = subparsers.add_parser(
        "refit", help="refit a profile's SPS tables from its recorded measurements (after a fitter change)",
        description="Re-derives sps.cost, sps.additive and sps.draft_skip_seconds from sps.measurements (the "
                    "median step time per (R, B) probe), keeps everything else, and redraws the plot.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write the refitted profile (default: in place)")
    p.set_defaults(func=_run_refit)


def _run_refit(args) -> int:
    from sglang_dspark.core.sps import SpsTable
    from sglang_dspark.profile.capture import fit_tables, plot

    profile = SlaProfile.load(args.file)
    points = profile.sps.measurements
    if not points:
        raise ProfileError(f"{args.file}: sps.measurements: empty, nothing to refit")
    cost, additive, skip = fit_tables(points, profile.sps.cost.max_batch_tokens)
    sps = msgspec.structs.replace(profile.sps, cost=cost, additive=additive, draft_skip_seconds=skip)
    out = args.out or args.file
    msgspec.structs.replace(profile, sps=sps).save(out)
    plot(points, SpsTable(additive, skip), out.with_suffix(".png"))
    print(f"refitted {out} ({len(points)} measurements) and {out.with_suffix('.png')}")
    return 0


def _add_set_sts(subparsers) -> None:
    p = subparsers.add_parser(
        "set-sts", help="put STS temperatures into a profile (or take them out)",
        description="Replaces the profile's sts section with an STS calibration JSON (SGLang's "
                    "DSparkStsCalibration, as `evaluate --sts-out` and benchmarks/sts_calibration.py write it), "
                    "fitted for the profile's drafter; one temperature per draft position (fingerprint.gamma).")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sts", type=Path, metavar="JSON", help="the STS calibration file to embed")
    which.add_argument("--clear", action="store_true", help="remove the profile's STS (uncalibrated confidences)")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write the profile (default: in place)")
    p.set_defaults(func=_run_set_sts)


def _run_set_sts(args) -> int:
    from sglang_dspark.core.calibration import StsCalibration

    profile = SlaProfile.load(args.file)
    sts = None if args.clear else StsCalibration.load(args.sts)
    updated = msgspec.structs.replace(profile, sts=sts)  # runs the profile's checks before anything is written
    out = args.out or args.file
    updated.save(out)
    print(f"{out}: " + ("STS removed" if sts is None else f"STS temperatures {sts.temperatures}"))
    return 0


def _add_capture(subparsers) -> None:
    """The in-process capture (reference engine) registers itself here: a module
    `sglang_dspark.profile.capture_cli` with `add_parser(subparsers)` (or `sglang_dspark.profile.capture`
    with `add_capture_parser(subparsers)`) that adds its sub-parser with `set_defaults(func=run)`,
    run(args) -> int, raising ProfileError / ValueError for a one-line error. Skipped while absent."""
    import importlib

    for module, hook in (("sglang_dspark.profile.capture_cli", "add_parser"),
                         ("sglang_dspark.profile.capture", "add_capture_parser")):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        if hasattr(mod, hook):
            getattr(mod, hook)(subparsers)
            return


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_dspark.profile", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO level)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_validate(subparsers)
    _add_export(subparsers)
    _add_refit(subparsers)
    _add_set_sts(subparsers)
    from sglang_dspark.profile.http_capture import add_capture_http_parser

    add_capture_http_parser(subparsers)
    _add_capture(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ProfileError, msgspec.ValidationError, ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

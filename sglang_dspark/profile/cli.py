"""`python -m sglang_dspark.profile`: capture, check, refit and export SLA profiles.

    capture       --model M [--draft DIR] --out FILE     SPS(B) of the reference engine, in process
    capture-http  --base-url URL --out FILE              any SGLang-compatible server, over HTTP
    snapshot      --base-url URL | --from-dir DIR --out FILE   the table a server learned
    validate      FILE [--model DIR --draft DIR]         schema, semantics, fingerprint
    export        FILE --out DIR                         SGLang's --speculative-dspark-*-path files
    refit         FILE [--out FILE]                      the tables again from the measurements
    set-sts       FILE (--sts JSON | --clear)            embed or remove the drafter's STS
    set-tiers     FILE --tier SPEC [--tier SPEC]         replace the SLA tiers (xF: F times one request alone)

Errors are one line on stderr, `error: <file or flag>: <reason naming the field>`, exit status 2
(argparse's usage errors too).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import socket
import sys
from pathlib import Path

from pydantic import ValidationError

from sglang_dspark.core.schema import error_line
from sglang_dspark.help_format import DefaultsHelpFormatter, OneLineErrorParser
from sglang_dspark.engine.cpu.names import FORMAT_CHOICES
from sglang_dspark.profile.schema import ProfileError, SlaProfile, parse_tiers

EXIT_ERROR = 2
HELP = DefaultsHelpFormatter
TIER_HELP = ("an SLA tier to record in the profile, repeatable: TOK_S is tokens per second per user, or xF for F times "
             "the single-stream speed of the table written (interactive:x0.5:2:4 promises half of what one request "
             "alone gets here)")


def _command_line() -> str:
    return shlex.join(["python", "-m", "sglang_dspark.profile", *sys.argv[1:]])


def _csv(kind):
    """An argparse type for comma-separated values of `kind`."""
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") from None
    return parse


def _cannot(subject, exc: OSError, verb: str) -> ProfileError:
    """`<subject>: cannot <verb> (<the OS's reason>)`: an OSError as one line naming the flag and file."""
    return ProfileError(f"{subject}: cannot {verb} ({exc.strerror or ' '.join(str(exc).split())})")


def _save(profile: SlaProfile, path: Path, flag: str | None = "--out") -> None:
    """`flag` names where the path came from (None: the profile's own FILE, written in place)."""
    try:
        profile.save(path)
    except OSError as exc:
        raise _cannot(f"{flag} {path}" if flag else str(path), exc, "write") from None


def _load_sts(path: Path):
    """The STS calibration JSON of `--sts`; ProfileError naming the flag and the file."""
    from sglang_dspark.core.calibration import StsCalibration

    try:
        return StsCalibration.load(path)
    except OSError as exc:
        raise _cannot(f"--sts {path}", exc, "read") from None
    except ValidationError as exc:
        raise ProfileError(f"--sts {path}: not an STS calibration JSON: {error_line(exc)}") from None


def _require_dir(flag: str, path) -> None:
    """A model directory to hash: a hub id or a mistyped path is refused by name, not reported as a
    fingerprint mismatch."""
    p = Path(path)
    if not p.exists():
        raise ProfileError(f"{flag} {path}: no such directory (the content hash needs the local model directory)")
    if not p.is_dir():
        raise ProfileError(f"{flag} {path}: not a directory")


def _at_least(**values_and_minimums) -> None:
    """`flag_name=(value, minimum)`; ProfileError `--flag-name V: must be >= M` for the first below."""
    for dest, (value, low) in values_and_minimums.items():
        if value < low:
            raise ProfileError(f"--{dest.replace('_', '-')} {value}: must be >= {low}")


# -- validate ------------------------------------------------------------------------------------
def _add_validate(sub) -> None:
    p = sub.add_parser("validate", formatter_class=HELP,
                       help="check a profile (schema, semantics, and with --model/--draft its fingerprint)",
                       description="Exit 0 with a one-line summary for a valid profile; exit 2 with one line naming "
                                   "the field otherwise.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--model", metavar="DIR", help="target model directory: check its content hash, the hardware and "
                                                  "library versions against the fingerprint")
    p.add_argument("--draft", metavar="DIR", help="drafter directory: check its content hash and gamma against the "
                                                  "fingerprint")
    p.add_argument("--engine", choices=("reference", "sglang"),
                   help="also require the profile to be for this engine; alone (without --model / --draft) it "
                        "compares only the engine, not this machine's hardware or library versions, so it runs "
                        "anywhere, e.g. on a workstation before a fleet rollout")
    p.set_defaults(func=_run_validate)


def _run_validate(args) -> int:
    from sglang_dspark.profile.fingerprint import check, require_match

    profile = SlaProfile.load(args.file)
    fp = profile.fingerprint
    for flag, d in (("--model", args.model), ("--draft", args.draft)):
        if d is not None:
            _require_dir(flag, d)
    if args.model or args.draft:  # this machine and these directories: hardware, versions, hashes, engine
        lines = check(profile, engine=args.engine or fp.engine, target_dir=args.model, draft_dir=args.draft,
                      tp=fp.tp, dp=fp.dp)
        require_match(str(args.file), lines, force=False)
    elif args.engine and fp.engine != args.engine:
        require_match(str(args.file), [f"engine: profile {fp.engine!r}, actual {args.engine!r}"], force=False)
    checked = (" (fingerprint matches)" if args.model or args.draft
               else f" (engine {args.engine} matches)" if args.engine else "")
    print(f"ok {args.file}: {profile.summary()}{checked}")
    return 0


# -- export ----------------------------------------------------------------------------------------
def _add_export(sub) -> None:
    p = sub.add_parser("export", formatter_class=HELP, help="write SGLang's SPS table and STS JSON files from a profile",
                       description="Writes sps_table.json (the additive table when the profile has one, else the "
                                   "cost table) and sts_calibration.json (when the profile has STS), for SGLang's "
                                   "--speculative-dspark-sps-table-path and --speculative-dspark-confidence-sts-path.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the JSON files into")
    p.set_defaults(func=_run_export)


def _run_export(args) -> int:
    profile = SlaProfile.load(args.file)
    try:
        sps, sts = profile.export_sglang(args.out)
    except OSError as exc:
        raise _cannot(f"--out {args.out}", exc, "write") from None
    print(f"--speculative-dspark-sps-table-path {sps}")
    if sts is not None:
        print(f"--speculative-dspark-confidence-sts-path {sts}")
    return 0


# -- refit -----------------------------------------------------------------------------------------
def _add_refit(sub) -> None:
    p = sub.add_parser("refit", formatter_class=HELP,
                       help="refit a profile's SPS tables from its recorded measurements (after a fitter change)",
                       description="Re-derives sps.cost, sps.additive and sps.draft_skip_seconds from "
                                   "sps.measurements, keeps everything else, and redraws the plot.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write the refitted profile (default: in place)")
    p.set_defaults(func=_run_refit)


def _run_refit(args) -> int:
    from sglang_dspark.profile.measure import fit_section
    from sglang_dspark.profile.plot import plot_profile

    profile = SlaProfile.load(args.file)
    if not profile.sps.measurements:
        raise ProfileError(f"{args.file}: sps.measurements: empty, nothing to refit")
    from sglang_dspark.profile.http_capture import diagonal_only

    # measurements on the diagonal only (SGLang's static verify, capture phase 1) cannot separate
    # the additive table's terms: such a profile stays 1-D
    section = fit_section(profile.sps.measurements, profile.sps.cost.max_batch_tokens,
                          skips_drafter_at_budget_0=profile.fingerprint.engine == "reference",
                          additive=not diagonal_only(profile.sps.measurements, profile.fingerprint.gamma))
    out = args.out or args.file
    _save(profile.replaced(sps=section), out, "--out" if args.out else None)
    plot_profile(section.measurements, section.table(), out.with_suffix(".png"), f"SPS(B): {profile.name}")
    print(f"refitted {out} ({len(section.measurements)} measurements) and {out.with_suffix('.png')}")
    return 0


# -- set-sts ---------------------------------------------------------------------------------------
def _add_set_sts(sub) -> None:
    p = sub.add_parser("set-sts", formatter_class=HELP, help="put STS temperatures into a profile (or take them out)",
                       description="Replaces the profile's sts section with an STS calibration JSON (SGLang's "
                                   "DSparkStsCalibration, as `evaluate --sts-out` writes it), fitted for the "
                                   "profile's drafter; one temperature per draft position (fingerprint.gamma).")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sts", type=Path, metavar="JSON", help="the STS calibration file to embed")
    which.add_argument("--clear", action="store_true", help="remove the profile's STS (uncalibrated confidences)")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write the profile (default: in place)")
    p.set_defaults(func=_run_set_sts)


def _run_set_sts(args) -> int:
    profile = SlaProfile.load(args.file)
    sts = None if args.clear else _load_sts(args.sts)
    updated = profile.replaced(sts=sts)  # the profile's checks run before anything is written
    _save(updated, args.out or args.file, "--out" if args.out else None)
    print(f"{args.out or args.file}: " + ("STS removed" if sts is None else f"STS temperatures {sts.temperatures}"))
    return 0


def _add_set_tiers(sub) -> None:
    p = sub.add_parser("set-tiers", formatter_class=HELP, help="replace a profile's SLA tiers",
                       description="Replaces the profile's sla_tiers with the --tier values given; a relative "
                                   "speed (xF) is resolved against the profile's own table.")
    p.add_argument("file", type=Path, metavar="FILE", help="the SLA profile YAML")
    p.add_argument("--tier", action="append", required=True, metavar="NAME:TOK_S:TTFT_S:MAX_CONC", help=TIER_HELP)
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write the profile (default: in place)")
    p.set_defaults(func=_run_set_tiers)


def _run_set_tiers(args) -> int:
    profile = SlaProfile.load(args.file)
    updated = profile.replaced(sla_tiers=parse_tiers(args.tier, profile.sps_table()))
    _save(updated, args.out or args.file, "--out" if args.out else None)
    print(f"{args.out or args.file}: " + ", ".join(f"{t.name} {t.tok_s_per_user} tok/s/user up to {t.max_concurrency}"
                                                   for t in updated.sla_tiers))
    return 0


# -- capture (in process) --------------------------------------------------------------------------
def _add_capture(sub) -> None:
    p = sub.add_parser("capture", formatter_class=HELP,
                       help="capture SPS(B) of the reference engine in process and write an SLA profile (YAML + PNG)",
                       description="Runs decode steps at forced verify budgets for several batch sizes, fits SGLang's "
                                   "1-D and additive SPS tables, and writes an SLA profile with its plot.")
    p.add_argument("--model", required=True, help="target model directory or zoo name (e.g. smollm2-135m-instruct)")
    p.add_argument("--draft", help="drafter directory (default: the shipped drafter whose target hash matches)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write; the plot goes next to it as .png")
    p.add_argument("--name", help="profile name (default: the file stem of --out)")
    p.add_argument("--requests", type=_csv(int), default=[1, 2, 4, 8, 16], metavar="R,R,...",
                   help="batch sizes R to probe")
    p.add_argument("--points", type=int, default=9,
                   help="budgets probed per batch size, >= 2 (all of 0..R*G when fewer)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps before each probe (>= 0)")
    p.add_argument("--repeats", type=int, default=3, help="measured steps per probe in each round (>= 1)")
    p.add_argument("--rounds", type=int, default=3,
                   help="passes over all probes (>= 1), each in a new random order; a probe's median pools its "
                        "rounds x repeats samples, so slow drift of a shared host averages out")
    p.add_argument("--prompt-tokens", type=int, default=128, help="context length of the probe requests (>= 1)")
    p.add_argument("--sts", type=Path, help="STS calibration JSON (SGLang format) to embed in the profile")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S:TTFT_S:CONCURRENCY",
                   help=TIER_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the probe order and the engine")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the probe requests' temperature: 0 (greedy) drafts through the greedy chain; > 0 (seeded "
                        "sampling) drafts position by position and prices a drafted step higher")
    p.add_argument("--dtype", choices=FORMAT_CHOICES, default="auto",
                   help="weight format of the engine measured, as launch --dtype (auto: as launch resolves it on this CPU); the "
                        "profile's fingerprint records it")
    p.add_argument("--cache-dir", type=Path, default=Path("~/.cache/sglang_dspark/models"), help="where zoo models live")
    p.set_defaults(func=_run_capture)


def _run_capture(args) -> int:
    from tqdm import tqdm

    from sglang_dspark import zoo
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.profile.capture import budget_grid, capture
    from sglang_dspark.profile.fingerprint import fingerprint_for
    from sglang_dspark.profile.measure import fit_section, summarize
    from sglang_dspark.profile.plot import plot_profile
    from sglang_dspark.profile.schema import SCHEMA_VERSION, Provenance, utc_now

    requests = sorted(set(args.requests))
    if not requests or requests[0] < 1:
        raise ProfileError(f"--requests: need batch sizes >= 1, got {args.requests}")
    # budget_grid needs two points (both ends); --prompt-tokens 0 would silently mean the whole prompt
    _at_least(points=(args.points, 2), warmup=(args.warmup, 0), repeats=(args.repeats, 1),
              rounds=(args.rounds, 1), prompt_tokens=(args.prompt_tokens, 1))
    try:
        model_dir = zoo.resolve_model(args.model, args.cache_dir)
    except zoo.ZooError as exc:
        raise ProfileError(f"--model {exc}") from None
    draft_dir = args.draft or zoo.shipped_drafter_for(model_dir)
    if draft_dir is None:
        raise ProfileError(f"--model {args.model}: no shipped drafter matches this target; pass --draft DIR "
                           f"(shipped: {zoo.describe_shipped_drafters()})")
    if args.draft is not None:
        _require_dir("--draft", args.draft)
    parse_tiers(args.tier)  # a malformed tier fails before the capture, not after it
    sts = _load_sts(args.sts) if args.sts else None
    engine = build_engine(model_dir, draft_dir, config=EngineConfig(mode="scheduled", max_running=max(requests),
                                                                    seed=args.seed), weight_format=args.dtype)
    weight_format = engine.runner.target.weight_format
    chat = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain, step by step, how a hash map handles collisions, with a Python example."}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = (chat * (args.prompt_tokens // len(chat) + 1))[-args.prompt_tokens:]
    total = args.rounds * sum(len(budget_grid(r, engine.gamma, args.points)) for r in requests)
    with tqdm(total=total, desc="SPS probes", unit="probe") as bar:
        samples = capture(engine, prompt, requests=requests, points=args.points, warmup=args.warmup,
                          repeats=args.repeats, rounds=args.rounds, seed=args.seed, temperature=args.temperature,
                          progress=bar)
    section = fit_section(summarize(samples), max(requests) * (engine.gamma + 1), skips_drafter_at_budget_0=True)
    profile = SlaProfile(
        version=SCHEMA_VERSION, name=args.name or args.out.stem,
        fingerprint=fingerprint_for(engine="reference", target_dir=model_dir, draft_dir=draft_dir, gamma=engine.gamma,
                                    weight_format=weight_format),
        sps=section, sts=sts, sla_tiers=parse_tiers(args.tier, section.table()),
        provenance=Provenance(command=_command_line(), date=utc_now(), repeats=args.repeats, warmup=args.warmup,
                              host=socket.gethostname(), rounds=args.rounds, source="capture"))
    _save(profile, args.out)
    plot_profile(section.measurements, section.table(), args.out.with_suffix(".png"),
                 f"SPS(B) of the reference engine, {weight_format}: {profile.name} (dashed: additive fit)")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}: {len(section.measurements)} probes")
    return 0


# -- capture-http ----------------------------------------------------------------------------------
def _add_capture_http(sub) -> None:
    from sglang_dspark.profile import http_capture as hc

    p = sub.add_parser("capture-http", formatter_class=HELP, help="measure a running server over HTTP and write a profile",
                       description=hc.__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--base-url", help="a live reference server, e.g. http://127.0.0.1:30000")
    source.add_argument("--from-dir", type=Path, metavar="DIR",
                        help="the export directory an SGLang worker learning its table writes it to "
                             "(learned-sps.dp<rank>.json; the launcher's --export-dir)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write")
    p.add_argument("--name", help="profile name (default: the --out file name without extension)")
    p.add_argument("--model", metavar="DIR", help="the server's target model directory, hashed into the fingerprint "
                                                  "(without it the hash is 'unknown' and launch refuses the profile "
                                                  "unless --force-profile)")
    p.add_argument("--draft", metavar="DIR", help="the server's drafter directory, hashed into the fingerprint")
    p.add_argument("--fractions", type=_csv(float), default=list(hc.DEFAULT_FRACTIONS), metavar="F,F,...",
                   help="forced verify-budget fractions of requests * gamma to sweep (SGLang accepts (0, 1]; "
                        "--phase static measures 1.0 only)")
    p.add_argument("--concurrency", type=_csv(int), metavar="N,N,...",
                   help="concurrent requests per level (clamped to the server's max_running_requests); default: "
                        f"powers of two up to the largest --tier's max_concurrency, at least "
                        f"{','.join(map(str, hc.DEFAULT_CONCURRENCIES))}")
    p.add_argument("--phase", choices=hc.PHASES, default="compact",
                   help="static: SGLang in static verify (every draft verified, forced fractions do nothing): "
                        "the diagonal only, written as the 1-D cost table (phase 1); compact: SGLang restarted in "
                        "compact mode with the phase-1 table, fractions swept: the additive table (phase 2; "
                        "refused when the records lie on the diagonal only)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request (ignore_eos)")
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.", help="prompt of every request")
    p.add_argument("--warmup-steps", type=int, default=1, help="step records dropped at the start of each level")
    p.add_argument("--min-samples", type=int, default=3, help="steps a (bs, batch_tokens) probe needs to be kept")
    p.add_argument("--step-field", choices=hc.STEP_FIELDS, help="record field with the step time "
                                                                "(default: the first present of the choices)")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S:TTFT_S:MAX_CONC",
                   help=TIER_HELP)
    p.add_argument("--hardware", help="hardware string for the fingerprint when the server is not on this machine "
                                      "(default: this machine's)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per HTTP request")
    p.add_argument("--api-key", help="Bearer token: the server's --admin-api-key (or --api-key when it has no admin key)")
    p.set_defaults(func=_run_capture_http)


def _run_capture_http(args) -> int:
    from sglang_dspark.profile.http_capture import capture_http

    specs = parse_tiers(args.tier)
    profile = capture_http(
        args.base_url, name=args.name or args.out.stem, model=args.model, draft=args.draft, fractions=args.fractions,
        concurrencies=args.concurrency, phase=args.phase, max_new_tokens=args.max_new_tokens, prompt=args.prompt,
        warmup_steps=args.warmup_steps, min_samples=args.min_samples, step_field=args.step_field,
        tiers=specs, hardware=args.hardware, timeout=args.timeout, command=_command_line(), api_key=args.api_key)
    profile = profile.replaced(sla_tiers=parse_tiers(args.tier, profile.sps_table()))
    _save(profile, args.out)
    print(f"wrote {args.out}: {profile.summary()}")
    return 0


# -- snapshot ------------------------------------------------------------------------------------
def _add_snapshot(sub) -> None:
    from sglang_dspark.profile import snapshot as snap

    p = sub.add_parser("snapshot", formatter_class=HELP, help="write the SPS table a live server learned as a profile",
                       description=snap.__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--base-url", help="a live reference server, e.g. http://127.0.0.1:30000")
    source.add_argument("--from-dir", type=Path, metavar="DIR",
                        help="the export directory an SGLang worker learning its table writes it to "
                             "(learned-sps.dp<rank>.json; the launcher's --export-dir)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write; the plot goes next to it as .png")
    p.add_argument("--name", help="profile name (default: the --out file name without extension)")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S:TTFT_S:MAX_CONC",
                   help=TIER_HELP)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for the HTTP request (--base-url)")
    p.add_argument("--api-key", help="Bearer token, when the server was started with --api-key (--base-url)")
    p.set_defaults(func=_run_snapshot)


def _run_snapshot(args) -> int:
    from sglang_dspark.profile.plot import plot_profile
    from sglang_dspark.profile.snapshot import snapshot, snapshot_from_dir

    name = args.name or args.out.stem
    parse_tiers(args.tier)
    if args.from_dir is not None:
        profile = snapshot_from_dir(args.from_dir, name=name, command=_command_line())
    else:
        profile = snapshot(args.base_url, name=name, command=_command_line(), timeout=args.timeout,
                           api_key=args.api_key)
    profile = profile.replaced(sla_tiers=parse_tiers(args.tier, profile.sps_table()))
    _save(profile, args.out)
    plot_profile(profile.sps.measurements, profile.sps_table(), args.out.with_suffix(".png"),
                 f"SPS(B) learned online: {profile.name} (dashed: the learned table)")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}: {profile.summary()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    lines = __doc__.splitlines()
    parser = OneLineErrorParser(prog="python -m sglang_dspark.profile", description=lines[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(lines[2:]))
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO level)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_capture, _add_capture_http, _add_snapshot, _add_validate, _add_export, _add_refit, _add_set_sts,
                _add_set_tiers):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except OSError as exc:  # one not caught where its flag is known: name the file, not the errno
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or ' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    except ValidationError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except (ProfileError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR

"""Does the suite catch the defects its tests are named after? Each named mutant (a small edit of
the code, or of a test's setup) is applied to a copy of the working tree and the tests that must
catch it are run there; a mutant is caught when those tests fail.

On demand, not in CI (minutes per mutant on a small host):
    python benchmarks/mutation_check.py [--only NAME,...] [--slow] [--no-baseline]
It prints a table (mutant, tests, caught) and writes benchmarks/results/mutation_check.json.

The copy is run with PYTHONPATH at its root, so the tests, and the servers and Locust processes they
start as subprocesses, import the mutated package rather than the editable install. An edit whose
text is no longer found (the code moved on) is reported "stale", one whose test file is not there
"no tests"; neither counts as caught. Mutants that only wrap a function are appended to the module,
so they survive refactors of its body.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/mutation_check.json"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file edited, relative to the repository root
    old: str  # text replaced (exactly one occurrence); "" appends `new` to the file instead
    new: str
    tests: tuple[str, ...]  # pytest node ids that must fail on it
    slow: bool = False  # its tests are `-m slow` ones: run only with --slow


def _wrap_sampling(body: str) -> str:
    """SamplingBatch.probs with its batch's fields altered for the call (`body` edits `self`)."""
    return ("\n\ndef _mutant_probs(self, logits, _original=SamplingBatch.probs):\n"
            "    saved = (self.temperature, self.top_k, self.top_p)\n"
            f"    {body}\n"
            "    try:\n"
            "        return _original(self, logits)\n"
            "    finally:\n"
            "        self.temperature, self.top_k, self.top_p = saved\n\n\n"
            "SamplingBatch.probs = _mutant_probs\n")


T = "tests/"
MUTANTS = [
    Mutant("close() a no-op", "sglang_dspark/server/streams.py",
           "            self.finished = True\n            self._engine.abort(self.request_id)",
           "            pass",
           (T + "test_reliability.py::test_clients_that_hang_up_free_every_slot_and_the_gauges_say_so",)),
    Mutant("probing disabled", "sglang_dspark/engine/policy.py",
           "        if self._undrafted_steps < self._probe_interval:",
           "        if True:",
           (T + "test_engine.py::test_scheduled_engine_skips_the_drafter_when_no_draft_pays_and_probes_periodically",
            T + "test_engine.py::test_probes_back_off_and_new_requests_use_the_observed_prior")),
    Mutant("hot-vocab: an outside mass without a hot set", "sglang_dspark/train/hot_vocab.py",
           "        return torch.softmax(logits, dim=-1), None",
           "        return torch.softmax(logits, dim=-1), torch.zeros(logits.shape[:-1])",
           (T + "test_train_hot_vocab.py::test_target_probs_from_the_log_normaliser_are_exact",)),
    Mutant("a duplicated --threads", "benchmarks/train_drafter.py",
           '"--time-budget-min", minutes, "--threads", threads,',
           '"--time-budget-min", minutes, "--threads", 1, "--threads", threads,',
           (T + "test_train_drafter_script.py::test_train_runs_both_drafters_on_a_core_each_or_one_on_both",)),
    Mutant("observer: anchor row counted as a draft", "sglang_dspark/sglang_plugin/observer.py",
           "drafts = (verify[:bs] - 1).clamp(min=0)",
           "drafts = verify[:bs].clamp(min=0)",
           (T + "test_sglang_plugin.py",)),
    Mutant("refit: ms / s slip (1-D table)", "sglang_dspark/profile/measure.py",
           "cost = fit_cost_table([m.batch_tokens for m in rows], [m.median_ms / 1e3 for m in rows], max_batch_tokens)",
           "cost = fit_cost_table([m.batch_tokens for m in rows], [m.median_ms for m in rows], max_batch_tokens)",
           (T + "test_profiles.py::test_cli_refit_rederives_the_tables_from_the_measurements",)),
    Mutant("refit: ms / s slip (additive table)", "sglang_dspark/profile/measure.py",
           "                                        [m.median_ms / 1e3 for m in rows], drafted)",
           "                                        [m.median_ms for m in rows], drafted)",
           (T + "test_profiles.py::test_cli_refit_rederives_the_tables_from_the_measurements",)),
    Mutant("snapshot of the prior", "sglang_dspark/profile/snapshot.py",
           "additive=SpsAdditiveCostTable.model_validate(table)",
           # a flat prior on the learned table's probes: valid, so only a comparison can tell
           'additive=SpsAdditiveCostTable.model_validate({**table, "alpha_seconds": [0.0] * len(table["alpha_seconds"]), '
           '"theta_seconds": [0.01] * len(table["theta_seconds"])})',
           (T + "test_snapshot.py::test_snapshot_validates_and_launch_uses_it",)),
    Mutant("random on-policy tokens", "sglang_dspark/train/sources.py",
           "    replies = engine.generate([prompts[i] for i in keep], params) if keep else []",
           "    replies = engine.generate([prompts[i] for i in keep], params) if keep else []\n"
           "    import torch\n"
           "    replies = [torch.randint(4, 48, (len(r),), generator=torch.Generator().manual_seed(seed + i)).tolist()\n"
           "               for i, r in zip(keep, replies)]",
           (T + "test_train_data.py::test_on_policy_sequences_are_the_targets_own_replies",)),
    Mutant("double-counted worker records", "sglang_dspark/loadtest/locust_hooks.py",
           "lambda environment, msg, **_: keep(environment, msg.data))",
           "lambda environment, msg, **_: (keep(environment, msg.data), keep(environment, msg.data)))",
           (T + "test_loadtest.py::test_distributed_locust_gives_the_same_report",)),
    Mutant("planner: the largest budget never chosen", "sglang_dspark/core/schedule.py",
           "    return int(np.argmax(theta))  # global search",
           "    return int(np.argmax(theta[:-1])) if theta.size > 1 else 0  # global search",
           (T + "test_schedule_properties.py::test_plan_total_matches_decide_budget",)),
    Mutant("decode_speed: tau over steps instead of request-steps", "benchmarks/decode_speed.py",
           '"tau": round(emitted / max(1, sum(r.bs for r in records)), 3),',
           '"tau": round(emitted / max(1, len(records)), 3),',
           (T + "test_benchmark_arithmetic.py::test_decode_speed_run_mode_summarises_the_recorded_steps",)),
    Mutant("decode_speed_pool: ratios across repeats", "benchmarks/decode_speed_pool.py",
           'zip(row[arm]["runs_output_tok_s"], target))', 'zip(row[arm]["runs_output_tok_s"], target[::-1]))',
           (T + "test_benchmark_arithmetic.py::test_decode_speed_pool_pairs_each_repeat_with_its_own_target_run",)),
    Mutant("launch --help imports torch", "sglang_dspark/launch.py",
           "def main(argv: list[str] | None = None) -> int:\n",
           "def main(argv: list[str] | None = None) -> int:\n    import torch  # noqa: F401\n",
           (T + "test_launch.py::test_module_help_runs_without_loading_models",)),
    Mutant("auto never picks SGLang", "sglang_dspark/launch.py",
           '    return "sglang", "CUDA device present and sglang importable"',
           '    return "reference", "CUDA device present and sglang importable"',
           (T + "test_launch.py::test_auto_picks_sglang_where_cuda_and_sglang_are_present",)),
    Mutant("target model: a refusal for the wrong reason", "sglang_dspark/engine/target_model.py",
           "        if min(lens) < 1:", "        if min(lens) < 3:",
           (T + "test_target_model.py::test_rejects_bad_batches",)),
    Mutant("STS calibration reorders confidences", "sglang_dspark/core/calibration.py",
           "    return torch.sigmoid(conf_logits.float() / temperatures.to(conf_logits.device, torch.float32))",
           "    return torch.sigmoid(conf_logits.float() / temperatures.to(conf_logits.device, torch.float32)"
           " + 0.05 * torch.sin(40 * conf_logits.float()))",
           (T + "test_calibration.py",)),
    Mutant("a router that never retries", "tests/test_router_scale_out.py",
           '"--health-check-interval-secs", "1",',
           '"--disable-retries", "--health-check-interval-secs", "1",',
           (T + "test_router_scale_out.py::test_a_replica_killed_mid_run_behind_sglang_router",), slow=True),
    Mutant("tool_choice auto: the parser never consulted", "sglang_dspark/server/tools.py",
           "        if not parser.has_tool_call(text):", "        if True:",
           (T + "test_tools_auto.py",)),
    Mutant("tool_choice auto: a streamed call sent as text too", "sglang_dspark/server/tools.py",
           '            return normal or "", [_call_entry(c.name, c.parameters, c.tool_index) for c in calls]',
           '            return piece or "", [_call_entry(c.name, c.parameters, c.tool_index) for c in calls]',
           (T + "test_tools_auto.py",)),
    Mutant("SGLang path: aborted requests get an SLA outcome", "sglang_dspark/sglang_plugin/observer.py",
           "\n                    and not self._was_aborted(rid, first)):", "):",
           (T + "test_sglang_request_outcomes.py",)),
    Mutant("fit worker: no deadline on a fit", "sglang_dspark/sglang_plugin/fitter.py",
           "        if self.busy and self.clock() - self._submitted_at > self.deadline:",
           "        if False:", (T + "test_sglang_fit_worker_lifecycle.py",)),
    Mutant("fit worker: close does not reap", "sglang_dspark/sglang_plugin/fitter.py",
           "        try:\n            self.proc.wait(timeout)\n        except subprocess.TimeoutExpired:\n"
           "            self.proc.kill()\n            self.proc.wait(timeout)\n", "",
           (T + "test_sglang_fit_worker_lifecycle.py",)),
    Mutant("fit worker: no parent check (a fork holds its socket)", "sglang_dspark/sglang_plugin/fitter.py",
           "            if os.getppid() != parent:", "            if False:",
           (T + "test_sglang_fit_worker_lifecycle.py::"
            "test_the_fit_worker_dies_with_its_scheduler_even_when_a_fork_of_it_holds_the_socket",)),
    Mutant("shutdown does not write the learned table", "sglang_dspark/sglang_plugin/observer.py",
           "            Exporter(*self.export).write(self.learned.ours, self.learner.snapshot(), self.learner.steps)",
           "            pass", (T + "test_sglang_fit_worker_lifecycle.py",)),
    Mutant("detokenizer always drops special tokens", "sglang_dspark/engine/detokenize.py",
           "skip_special_tokens=self.skip_special_tokens)", "skip_special_tokens=True)",
           (T + "test_tools_special_tokens.py",)),
    Mutant("special tokens dropped with tools (SGLang keeps them)", "sglang_dspark/server/params.py",
           '    if isinstance(body, ChatCompletionRequest) and body.tools and body.tool_choice != "none":',
           "    if False:", (T + "test_tools_special_tokens.py",)),
    Mutant("avg_spec_accept_length without the bonus token", "sglang_dspark/engine/records.py",
           "        self.emitted += record.bs + record.accepted_drafts", "        self.emitted += record.accepted_drafts",
           (T + "test_engine.py::test_server_info_reports_sglangs_avg_spec_accept_length",)),
    Mutant("chat refuses SGLang's ignore_eos", "sglang_dspark/server/protocol.py",
           "    ignore_eos: StrictBool = False  # SGLang extension\n", "",
           (T + "test_bench_serving.py::test_sglang_bench_serving_completes_every_request[sglang-oai-chat]",),
           slow=True),
    Mutant("the first launch converts the model in the serving process", "sglang_dspark/zoo.py",
           "    locate_packaged_file(ZOO[name])  # a missing package",
           "    return _convert_here(name, out)\n    locate_packaged_file(ZOO[name])  # a missing package",
           (T + "test_first_launch.py::test_a_first_launch_runs_its_steps_on_the_engine_team_alone",), slow=True),
    Mutant("/generate ignores max_new_tokens", "sglang_dspark/server/params.py",
           "        max_tokens=_default_max_tokens(room) if sp.max_new_tokens is None else sp.max_new_tokens,",
           "        max_tokens=_default_max_tokens(room),",
           (T + "test_bench_serving.py::test_sglang_bench_serving_completes_every_request[sglang]",), slow=True),
    # The warping of temperature / top_k / top_p: run last (the chi-square tests are the longest).
    Mutant("sampling ignores top_k", "sglang_dspark/engine/sampling.py", "",
           _wrap_sampling("self.top_k = self.top_k.clone().zero_()"), (T + "test_sampling_params.py",)),
    Mutant("sampling ignores top_p", "sglang_dspark/engine/sampling.py", "",
           _wrap_sampling("self.top_p = self.top_p.clone().fill_(1.0)"), (T + "test_sampling_params.py",)),
    Mutant("every temperature > 0 treated as 1", "sglang_dspark/engine/sampling.py", "",
           _wrap_sampling("self.temperature = (self.temperature > 0).float()"), (T + "test_sampling_params.py",)),
]


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored) into `dest`."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run_tests(copy: Path, tests, slow: bool, timeout_s: float, stop_early: bool = True
              ) -> tuple[int, float, str, list[str], str]:
    """(pytest's exit code, seconds, its summary line, the node ids that failed or errored, the
    first assertion line of the failure)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *(["-x"] if stop_early else []),
           *(["-m", "slow"] if slow else []), *tests]
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout_s)
        lines = (done.stdout + done.stderr).strip().splitlines()
        rc, tail = done.returncode, lines[-1:]
        reason = next((line.strip() for line in lines if line.startswith("E ")), "")
        failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1]
    except subprocess.TimeoutExpired:
        rc, tail, failed, reason = -1, ["timed out"], list(tests), ""
    return rc, round(time.monotonic() - start, 1), " ".join(tail), failed, reason


def apply(copy: Path, mutant: Mutant) -> str | None:
    """Edit the copy; the original text to restore, or None when the mutant is stale."""
    path = copy / mutant.path
    text = path.read_text()
    if not mutant.old:
        path.write_text(text + mutant.new)
        return text
    if text.count(mutant.old) != 1:
        return None
    path.write_text(text.replace(mutant.old, mutant.new))
    return text


def verdict(rc: int, summary: str) -> str:
    """pytest's 1 with a test failed: caught; 0: survived; an error (a fixture, an import, a timeout
    also exit 1 or other codes) is no catch: the mutant broke something else first."""
    if rc == 0:
        return "no"
    return "yes" if rc == 1 and " failed" in f" {summary}" and "error" not in summary else "error"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated mutant names to run (default: all)")
    p.add_argument("--slow", action="store_true", help="also run the mutants whose tests are slow (-m slow)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the run of every listed fast test on the unmutated copy (which must pass)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    p.add_argument("--out", type=Path, default=OUT, help="JSON output path")
    args = p.parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {m.name for m in MUTANTS}
    if unknown:
        p.error(f"--only: unknown mutant(s) {sorted(unknown)}")
    mutants = [m for m in MUTANTS if (not wanted or m.name in wanted) and (args.slow or not m.slow)]
    rows, baseline = [], None
    with tempfile.TemporaryDirectory(prefix="mutation_check_") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        env = {**os.environ, "PYTHONPATH": str(copy)}
        where = subprocess.run([sys.executable, "-c", "import sglang_dspark; print(sglang_dspark.__file__)"],
                               cwd="/", env=env, capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(copy)):
            sys.exit(f"error: the copy's package is not the one imported ({where}); mutants would not apply")
        if not args.no_baseline:  # a mutant only counts as caught by tests that pass without it
            baseline = {}
            for slow in sorted({m.slow for m in mutants}):
                tests = sorted({t for m in mutants if m.slow == slow for t in m.tests
                                if (copy / t.split("::")[0]).exists()})
                if not tests:
                    continue
                rc, seconds, tail, failed, reason = run_tests(copy, tests, slow, args.timeout, stop_early=False)
                baseline["slow" if slow else "fast"] = {"tests": tests, "passed": rc == 0, "seconds": seconds,
                                                        "summary": tail, "failed": failed, "reason": reason}
                print(f"baseline (unmutated, {'slow' if slow else 'fast'} tests): {'pass' if rc == 0 else 'FAIL'} "
                      f"in {seconds:g} s: {tail}", flush=True)
        for m in mutants:
            missing = [t for t in m.tests if not (copy / t.split("::")[0]).exists()]
            original = None if missing else apply(copy, m)
            if missing:
                rows.append({"mutant": m.name, "file": m.path, "tests": list(m.tests), "caught": "no tests",
                             "seconds": 0.0, "summary": f"test files not in the tree: {missing}"})
            elif original is None:
                rows.append({"mutant": m.name, "file": m.path, "tests": list(m.tests), "caught": "stale",
                             "seconds": 0.0, "summary": "the edited text is no longer in the file"})
            else:
                try:
                    rc, seconds, tail, _, reason = run_tests(copy, m.tests, m.slow, args.timeout)
                finally:
                    (copy / m.path).write_text(original)
                caught = verdict(rc, tail)
                group = (baseline or {}).get("slow" if m.slow else "fast") or {}
                if caught == "yes" and any(f.startswith(t) for f in group.get("failed", []) for t in m.tests):
                    caught = "unknown"  # its tests fail unmutated too
                rows.append({"mutant": m.name, "file": m.path, "tests": list(m.tests), "caught": caught,
                             "seconds": seconds, "summary": tail, "reason": reason})
            r = rows[-1]
            print(f"{r['mutant']:<45} {r['caught']:<6} {r['seconds']:>7.1f} s  {', '.join(m.tests)}", flush=True)
    print(f"\n{'mutant':<45} {'caught':<6} tests")
    for r in rows:
        print(f"{r['mutant']:<45} {r['caught']:<6} {', '.join(t.removeprefix(T) for t in r['tests'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "baseline": baseline, "mutants": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["caught"] == "yes" for r in rows) and all(b["passed"] for b in (baseline or {}).values()) else 1


if __name__ == "__main__":
    sys.exit(main())

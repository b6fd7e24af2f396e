"""Where the plugin hooks into SGLang 0.5.23, by dotted path. `register()` checks every one of them
before touching anything: an SGLang whose internals moved gets no hook at all, not half of them."""

from __future__ import annotations

# The releases the hooks were run against (tests/test_sglang_plugin.py drives SGLang's own classes):
# any other, a patch release included, is refused until it has been tested and added here.
TESTED_VERSIONS = ("0.5.23",)

P = "sglang.srt.speculative.dspark_components.dspark_planner"
O = "sglang.srt.speculative.dspark_components.dspark_observability"
S = "sglang.srt.speculative.dspark_components.dspark_sts"

PLANNER = f"{P}.compute_verify_token_budget"  # AROUND: SLA decision or learned table, else the original
BUDGET_DECISION = f"{P}.VerifyBudgetDecision"  # the struct the planner returns (read, not hooked)
OBSERVE_STEP = f"{O}.DsparkStepObservers.observe_verify_step"  # AROUND: metrics, learner feed
PREFILL_STEP = f"{O}.DsparkStepObservers.note_prefill_step"  # AFTER: no decode-step interval across it
REQUEST_FINISHED = f"{O}.DsparkStepObservers.note_request_finished"  # AFTER: per-user speed at a real finish
OBSERVERS_INIT = f"{O}.DsparkStepObservers.__init__"  # AFTER: settings read at start; STS refused in compact
STS_RECORDER = f"{S}.StsDataRecorder"  # REPLACE (class): per-rank files, final flush
SCHEDULER_SHUTDOWN = "sglang.srt.managers.scheduler.Scheduler.release_host_resources"  # AFTER: flush STS,
# write the learned table, stop the fit worker
SCHEDULER_ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"  # AFTER: aborted requests get no SLA outcome
PARALLEL = "sglang.srt.runtime_context.get_parallel"  # read inside hooks only (unpublished at register)
SCHEDULE = "sglang.srt.runtime_context.get_schedule"  # disable_overlap_schedule: which step an interval times
ADDITIVE_TABLE = "sglang.srt.speculative.dspark_components.dspark_sps.SpsAdditiveCostTable"  # the learned table

HOOKED = (PLANNER, OBSERVE_STEP, PREFILL_STEP, REQUEST_FINISHED, OBSERVERS_INIT, STS_RECORDER, SCHEDULER_SHUTDOWN,
          SCHEDULER_ABORT)
READ = (BUDGET_DECISION, PARALLEL, SCHEDULE, ADDITIVE_TABLE)

"""The engine on its own thread: the only place engine state is touched from outside.

Servers and benchmarks talk to `AsyncEngine` (it implements engine/protocol.py's EngineClient).
Requests, aborts and runtime knobs travel through one inbox the engine thread drains between
steps; a call that needs an answer (server info, knobs, flush) carries a Future. Request outputs
come back through each request's callback, on the engine thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from sglang_dspark.engine.engine import Engine
from sglang_dspark.engine.request import EngineBusy, RequestOutput
from sglang_dspark.engine.sampling import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")
IDLE_WAIT_S = 0.5  # how long an idle engine thread blocks on the inbox before checking for stop
# idle this long, the engine gives its caches' pages and freed heap back (Engine.release_idle_memory):
# long enough that a client pausing between requests does not pay the page faults each time
IDLE_RELEASE_S = 5.0


def off_the_main_thread(fn: Callable[[], T]) -> T:
    """fn() on a short-lived thread, its result or exception here. For torch work before the engine
    thread starts (the weight format's timing): once the main thread has run a parallel torch op,
    GNU OpenMP slowed every other thread's (seen on a 2-core CPU; RESULTS_LOG), while a finished
    helper thread's pool left the engine thread at full speed (AsyncEngine.built_on_its_thread)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dspark-torch-setup") as pool:
        return pool.submit(fn).result()


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._go: threading.Event | None = None  # set by start() for a thread that built the engine
        self._ids = itertools.count()
        self._live: set[str] = set()  # ids submitted and not yet finished (a client's rid must be unique)
        self._live_lock = threading.Lock()
        self.fault: str | None = None  # set once a step failed for no single request: unhealthy until restarted

    # ---- what the server reads (immutable after construction) ----------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_len(self) -> int:
        return self.engine.max_len

    @property
    def max_in_flight(self) -> int:
        """Requests running or queued, at most; `submit` refuses more (EngineBusy)."""
        return self.engine.max_in_flight

    @property
    def alive(self) -> bool:
        """The engine thread is running (a dead one would leave every request waiting) and no step
        has failed for a reason no single request explains (engine/isolation.py)."""
        return self._thread is not None and self._thread.is_alive() and self.fault is None

    def model_info(self) -> dict:
        return self.engine.model_info()  # built from configuration only: safe from any thread

    @property
    def metrics(self):
        return self.engine.metrics  # prometheus_client's collectors are thread-safe

    # ---- requests ------------------------------------------------------------------------------
    def submit(self, prompt_ids, params: SamplingParams, callback: Callable[[RequestOutput], None],
               request_id: str | None = None) -> str:
        """Queue a request; ValueError (naming the field) when the engine would refuse it."""
        prompt_ids = [int(t) for t in prompt_ids]
        self.engine.validate(prompt_ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        with self._live_lock:
            if rid in self._live:
                raise ValueError(f"rid: a request with id {rid!r} is already in flight")
            if len(self._live) >= self.max_in_flight:
                raise EngineBusy(f"the server holds {len(self._live)} requests, its limit "
                                 f"(--max-running + --max-queued-requests); retry later")
            self._live.add(rid)
        user_callback = callback

        def callback(out: RequestOutput) -> None:  # engine thread
            if out.finished:
                with self._live_lock:
                    self._live.discard(rid)
            user_callback(out)

        def admit(engine: Engine) -> None:
            try:
                engine.submit(prompt_ids, params, callback, rid)
            except Exception:  # validated above, so a bug: the client still gets a final output
                logger.exception("request %s could not be submitted", rid)
                callback(RequestOutput(rid, [], "", True, "abort", len(prompt_ids), 0))

        self._inbox.put(admit)
        return rid

    def abort(self, request_id: str) -> None:
        self._inbox.put(lambda e: e.abort(request_id))

    def abort_all(self) -> None:
        """End every running and waiting request now (finish_reason "abort"): the end of a drain."""
        self._inbox.put(Engine.abort_all)

    def call(self, fn: Callable[[Engine], T]) -> Future:
        """Run fn(engine) on the engine thread between steps; its result (or error) in a Future."""
        future: Future = Future()

        def run(engine: Engine) -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(engine))
                except Exception as exc:  # the caller gets it, the engine keeps running
                    future.set_exception(exc)

        self._inbox.put(run)
        return future

    def server_info(self) -> Future:
        return self.call(Engine.server_info)

    def set_internal_state(self, force_budget_frac: Any = ..., clear_records: bool = False) -> Future:
        """SGLang's runtime knobs: the forced verify budget (None: the planner's; `...`: unchanged)
        and clearing the step records. The Future holds the resulting forced budget."""
        def apply(engine: Engine):
            if force_budget_frac is not ...:
                engine.set_forced_budget(force_budget_frac)
            if clear_records:
                engine.records.clear()
            return engine.policy.forced_budget_frac

        return self.call(apply)

    def flush_cache(self) -> Future:
        return self.call(Engine.flush_cache)

    # ---- the thread ----------------------------------------------------------------------------
    @classmethod
    def built_on_its_thread(cls, build: Callable[[], Engine]) -> "AsyncEngine":
        """An AsyncEngine whose engine `build()` makes on the engine thread itself, which then waits
        for `start()`. Every torch op of the engine, loading and tuning included, then runs on one
        native thread: decode steps ran markedly slower on a thread other than the one that had
        loaded the models, GNU OpenMP's thread pools of the two getting in each other's way
        (benchmarks/RESULTS_LOG.md, "One thread for torch").
        `build()`'s exception is raised here."""
        built: Future = Future()
        go = threading.Event()

        def run() -> None:
            try:
                built.set_result(build())
            except BaseException as exc:  # the caller re-raises it
                built.set_exception(exc)
                return
            go.wait()
            if not client._stop.is_set():
                client._loop()

        thread = threading.Thread(target=run, name="dspark-engine", daemon=True)
        thread.start()
        try:
            engine = built.result()
        except BaseException:
            thread.join()
            raise
        client = cls(engine)
        client._thread, client._go = thread, go
        return client

    def start(self) -> None:
        self._stop.clear()
        if self._go is not None:  # the thread that built the engine runs it
            self._go.set()
            return
        self._thread = threading.Thread(target=self._loop, name="dspark-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread after the current step; requests still running end with "abort"."""
        self._stop.set()
        self._inbox.put(lambda e: None)  # wake an idle thread
        if self._go is not None:
            self._go.set()  # a thread that built the engine and was never started ends now
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():  # a step outlived the timeout: the engine is still that thread's
                logger.error("engine thread still running %.0f s after shutdown; leaving it", timeout)
                return
        self._thread = None
        self._drain()
        self.engine.abort_all()

    def _loop(self) -> None:
        engine = self.engine
        trimmed = True  # nothing freed since start-up's own trim
        idle_since = time.monotonic()
        while not self._stop.is_set():
            arrived = self._drain(wait=IDLE_WAIT_S if engine.idle else 0.0)
            if engine.idle:
                engine.update_gauges()  # an abort can empty the engine: the gauges say so at once
                if arrived:
                    idle_since = time.monotonic()
                elif not trimmed and time.monotonic() - idle_since >= IDLE_RELEASE_S:
                    trimmed = engine.release_idle_memory()  # what the last requests used goes back
                continue
            trimmed, idle_since = False, time.monotonic()
            try:
                engine.step()  # a request's own fault ends only that request (engine/isolation.py)
            except Exception as exc:  # the engine's: end what runs, and /health says so from now on
                logger.exception("engine step failed for no single request; aborting running requests")
                self.fault = f"{type(exc).__name__}: {exc}"
                for req in list(engine.scheduler.running):
                    engine.fail(req.id, f"the engine failed ({self.fault})")

    def _drain(self, wait: float = 0.0) -> int:
        """Run the inbox's items (waiting up to `wait` s for the first); returns how many ran."""
        deadline, done = time.monotonic() + wait, 0
        while True:
            try:
                item = self._inbox.get(timeout=max(0.0, deadline - time.monotonic())) if wait else self._inbox.get_nowait()
            except queue.Empty:
                return done
            done += 1
            try:
                item(self.engine)
            except Exception:  # a bad inbox item must not stop the engine thread
                logger.exception("engine inbox item failed")
            wait = 0.0  # after the first item, take only what is already there

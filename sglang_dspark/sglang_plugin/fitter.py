"""The learned table's refits, in a worker process of their own.

A refit (core/sps_online.py: a weighted NNLS fit over up to 2,048 steps, twice) is pure Python and
numpy; on a thread of the scheduler process it holds the GIL that SGLang's scheduler thread needs
between steps (benchmarks/plugin_overhead.py: beside a busy main thread a fit took more than twice as long,
the main thread stalled the while). Here it runs in one persistent child per scheduler
process, started once with the learner; the scheduler thread only hands the samples over (a few
arrays, one write to a socket) and picks the fitted table up when it has arrived (a poll), never
waiting for either. It also writes the learned table to the export directory (export.py).

The child dies with its parent: it reads its socket, and the parent's end closes when the parent
dies (SIGKILL included), so its next read ends it. A process the scheduler forked later holds a
copy of that end and would keep it open, so the child also checks every PARENT_CHECK_S that its
parent is still the process that started it (whose pid it is given: a pid the child read itself
could already be its new parent's, were the scheduler killed before the child got that far). It runs with one BLAS thread and at nice 10:
the scheduler's cores are SGLang's, and on a host short of cores the refit waits, not the scheduler.

    python -m sglang_dspark.sglang_plugin.fitter FD PARENT_PID     (started by FitWorker, not by hand)
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np

logger = logging.getLogger(__name__)

_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# A refit takes well under a second, even beside a busy scheduler: one not back after this long is a
# hung worker, killed, and the refits move to the fallback thread instead of stopping for good.
FIT_DEADLINE_S = 30.0
PARENT_CHECK_S = 1.0  # how often an idle child checks that its parent still lives


def _encode(samples) -> np.ndarray:
    """StepSamples as one (n, 5) float64 array: cheap to pickle, unlike n dataclasses."""
    return np.array([(s.num_requests, s.batch_tokens, s.drafted, s.seconds, s.index) for s in samples],
                    dtype=np.float64).reshape(-1, 5)


def _decode(rows: np.ndarray):
    from sglang_dspark.core.sps_online import StepSample

    return [StepSample(int(r), int(b), bool(d), float(y), int(i)) for r, b, d, y, i in rows.tolist()]


class FitWorker:
    """The parent's handle. `submit` and `poll` never block on the child; any failure of the child
    (exit, crash, a broken socket) sets `dead` and is logged once, and the caller fits on its own."""

    def __init__(self, learner, export: tuple | None = None, *, deadline: float = FIT_DEADLINE_S,
                 clock=time.monotonic):  # export: export.Exporter's arguments
        self.deadline, self.clock, self._submitted_at = deadline, clock, 0.0
        parent, child = socket.socketpair()
        env = {**os.environ, **{k: "1" for k in _THREAD_ENV}}
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(child.fileno()), str(os.getpid())],
                                         pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self._readable = select.poll()  # one poll object: Connection.poll builds a selector per call
        self._readable.register(self.conn.fileno(), select.POLLIN)
        self.ready = self.busy = self.dead = False
        config = dict(prior=learner.prior, prior_weight=learner.prior_weight, half_life=learner.half_life,
                      outlier_mads=learner.outlier_mads)
        self._send(("config", config, export))  # read by the child once it has imported numpy and the fit

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def available(self) -> bool:
        """Ready for a fit now (polls for the child's ready message, never waits)."""
        if not self.ready and not self.dead:
            self.poll()
        return self.ready and not self.busy and not self.dead

    def submit(self, samples, steps: int) -> bool:
        """Hand a snapshot over; False (nothing sent) unless `available`."""
        if not self.available:
            return False
        self._submitted_at = self.clock()
        self.busy = self._send(("fit", _encode(samples), steps))
        return self.busy

    def poll(self, timeout: float = 0.0):
        """The finished fit, ("table", table, steps, prior_scale, prior_draft_scale) or ("error",
        traceback); None while there is none. `timeout` > 0 waits for it (tests, shutdown)."""
        if self.dead:
            return None
        try:
            while self._readable.poll(int(timeout * 1000)):  # POLLHUP too: recv_bytes then raises EOFError
                message = pickle.loads(self.conn.recv_bytes())
                if message[0] == "ready":
                    self.ready = True
                    if not self.busy:
                        return None
                    continue
                self.busy = False
                return message
        except Exception as exc:  # noqa: BLE001 - EOF, a reset socket, a garbled message: never the scheduler's
            self._die(exc)
            return None
        if self.busy and self.clock() - self._submitted_at > self.deadline:
            self._die(TimeoutError(f"no fit back {self.deadline:g} s after it was handed over"))
        return None

    def wait_ready(self, timeout: float) -> bool:
        """Block until the child has started (tests and benchmarks; never the scheduler thread)."""
        if not self.ready and not self.dead:
            self.poll(timeout)
        return self.ready and not self.dead

    def close(self, timeout: float = 5.0) -> None:
        """Stop the child and reap it: EOF on its socket ends it; one still running after `timeout`
        (a fit that hangs) is killed."""
        self.dead = True
        self.conn.close()  # the child reads EOF and exits
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def _send(self, message) -> bool:
        try:
            self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            return True
        except Exception as exc:  # noqa: BLE001 - a broken pipe above all
            self._die(exc)
            return False

    def _die(self, exc: BaseException) -> None:
        if not self.dead:
            self.dead = True
            code = self.proc.poll()
            if code is None:  # hung, or its socket broke while it runs: it must not linger
                self.proc.kill()
                try:
                    self.proc.wait(1.0)  # SIGKILL: reaped within milliseconds
                except subprocess.TimeoutExpired:
                    pass
            logger.error("online SPS fit worker (pid %d) is gone (%s: %s; exit code %s): refits run on a "
                         "thread of the scheduler process from now on", self.proc.pid, type(exc).__name__, exc, code)
            self.conn.close()


def _parent_left(conn: Connection, parent: int) -> bool:
    """Wait for a message (or EOF) from the parent; True if the parent died first (reparented)."""
    while not conn.poll(PARENT_CHECK_S):  # EOF and data both end the wait
        if os.getppid() != parent:  # the scheduler is gone, a fork of it holds the socket
            return True
    return False


def _serve(conn: Connection, parent: int) -> None:
    from sglang_dspark.core.sps_online import OnlineSpsEstimator

    if _parent_left(conn, parent):  # killed before it sent the config
        return
    kind, config, export = pickle.loads(conn.recv_bytes())
    assert kind == "config", kind
    estimator = OnlineSpsEstimator(**config)
    exporter = None
    if export is not None:
        from sglang_dspark.sglang_plugin.export import Exporter

        exporter = Exporter(*export)

    def send(message) -> None:
        conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    send(("ready",))
    while True:
        if _parent_left(conn, parent):
            return
        try:
            _, rows, steps = pickle.loads(conn.recv_bytes())
        except EOFError:  # the parent closed its end or died
            return
        try:
            samples = _decode(rows)
            table = estimator.fit(samples)
        except Exception:  # noqa: BLE001 - reported to the parent, which keeps its table
            send(("error", traceback.format_exc()))
        else:
            if exporter is not None:  # first: a reader of the file then has what the parent adopts
                exporter.maybe_write(table, samples, steps)
            send(("table", table, steps, estimator.prior_scale, estimator.prior_draft_scale))


NICE = 10  # where cores are short, the scheduler thread (nice 0) runs first and the refit waits


def main(argv: list[str]) -> int:
    conn, parent = Connection(int(argv[0])), int(argv[1])
    try:
        os.nice(NICE)
    except OSError:
        pass  # not permitted here: the fit runs at the parent's priority
    try:
        _serve(conn, parent)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: so is the reason to run
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

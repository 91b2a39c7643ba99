"""One worker process under the call protocol, seen from the judge.

A `Session` is made when a worker has been given its task (harness.py `Judge._start`) and closed
when the evaluation is done with it. It owns the process, its channel, the data plane (and the
shared GPU region, when mapping one worked), and what the calls learn along the way: the
protocol's measured cost per timed call, how the worker says it timed them, the relative-L2 bounds
the checked calls found. `recv` is the only way the judge waits for the worker: it watches the
process's health, memory and disk while it waits, and turns every way of not answering into a
failure of the run (`Stop`).
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable, TypeVar

from .cudaipc import SharedGpuBuffer
from .evaluation import Stop
from .protocol import Channel, ChannelClosed, ChannelTimeout, DataPlane, ProtocolError, Ready, Reply
from .sandbox import Sandboxed
from .verdict import FailureCategory as FC

M = TypeVar("M")


class Session:
    def __init__(self, proc: Sandboxed, chan: Channel, plane: DataPlane, shared: SharedGpuBuffer | None = None, *,
                 memory_limit_mb: int, disk_limit_mb: int, trusted: bool = False):
        self.proc, self.chan, self.plane, self.shared = proc, chan, plane, shared
        self.memory_limit_mb, self.disk_limit_mb = memory_limit_mb, disk_limit_mb
        self.ready = Ready()  # the worker's message once ModelNew is constructed
        self.judge_release = False  # the judge writes each call's inputs and opens its gate (timing.py)
        self.staged = False  # each call reads a copy of its inputs in the process's own memory (stage_inputs)
        # per timed call, aligned with the times `_drive` returns: the round trip of the untimed
        # request just before it (the protocol's cost under the load of that moment) and how the
        # candidate process says it timed the call
        self.protocol_ms: list[float] = []
        self.methods: list[str] = []
        # CPU backend, per timed call: the CPU time of the candidate's busiest thread (ms), a
        # lower bound of the call's wall time that no number of cores divides (timing.reconcile)
        self.busiest_ms: list[float] = []
        # CPU backend, per timed call: the judge's wall time of the call, the time the candidate's
        # threads and the judge's waited for a core meanwhile (ms; None where it could not be
        # read) and whether every thread was still there to be read afterwards (timing.reconcile)
        self.wall_ms: list[float] = []
        self.waited_ms: list[float | None] = []
        self.wall_steady: list[bool] = []
        # Per output: bound on the error against the reference for calls without a float64
        # reference, the largest found on the checked calls (None: the fixed per-dtype bound).
        self.rel_l2_bounds: list | None = None
        # outputs the precision probe passed as approximations -> the bound of their warm-up and timed
        # pairs (harness: JudgeConfig.approx_rel_l2)
        self.paired: dict[int, float] | None = None
        self.reduced_isolation: list[str] = []  # what a judge that is not root cannot isolate
        self.trusted = trusted  # the reference or a baseline: no candidate policy applies to what it runs
        # whether the worker said its candidate's code loads next (protocol.Loading): a process that
        # dies before that ran only the judge's code, so its death is the judge's failure
        self.candidate_code = False

    def forget_timed_calls(self) -> None:
        """Drop what the timed calls so far measured, before a second round of them."""
        self.protocol_ms, self.methods, self.busiest_ms = [], [], []
        self.wall_ms, self.waited_ms, self.wall_steady = [], [], []

    def timing_method(self) -> str:
        """How most of the timed calls were timed, as the candidate process reported it."""
        methods = self.methods
        return max(set(methods), key=methods.count) if methods else "events"

    @property
    def calls(self):
        """The region per-call inputs and outputs go through: shared GPU memory, else the host plane."""
        return self.shared.tensor if self.shared is not None else self.plane.view

    def recv(self, deadline: float, what: str, parse: Callable[[dict], M] = Reply.parse, *,
             or_none: bool = False) -> M | None:
        """The worker's next message, parsed by `parse` into the record the step expects (protocol.py:
        a parse never raises), waiting until `deadline` while watching the process's health, memory
        and disk; `what` names the step in the failure. `or_none`: None at the deadline instead of a
        timeout failure."""
        chan, proc = self.chan, self.proc
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if or_none:
                    return None
                # the process's memory at that moment says whether it was hoarding when stopped (a
                # slow host can page in a hoard more slowly than the time limit allows)
                raise Stop(FC.TIMEOUT, f"{what} did not finish within its time limit (the candidate "
                                       f"process held {proc.rss_mb():.0f} MiB of host memory; limit "
                                       f"{self.memory_limit_mb} MiB)")
            try:
                raw = chan.recv(timeout=min(remaining, 0.25))
            except ChannelTimeout:
                pass
            except ChannelClosed:
                raise self._closed(what) from None
            except ProtocolError as exc:
                raise Stop(FC.TAMPERING, f"malformed message from the candidate process: {exc}") from None
            else:
                try:
                    return parse(raw)
                except RecursionError:  # nested deeper than the judge reads
                    raise Stop(FC.TAMPERING, "malformed message from the candidate process: nested too deeply") \
                        from None
            if not proc.alive():
                raise self._died(what)
            if proc.rss_mb() > self.memory_limit_mb:
                raise Stop(FC.OOM, f"the candidate process exceeded {self.memory_limit_mb} MiB of host memory "
                                   f"during {what}")
            used = proc.disk_used_mb()
            if used > self.disk_limit_mb:
                raise Stop(FC.RESOURCE, f"the candidate process used {used:.0f} MiB of disk during {what} "
                                        f"(limit {self.disk_limit_mb} MiB)")

    def send(self, message: dict, what: str) -> None:
        """A message to the worker during `what`. A worker that has died by then (its end of the
        socket gone: a broken pipe or a reset) fails the run as `recv` does, with how it died, not
        as an error of the judge's own."""
        try:
            self.chan.send(message)
        except (BrokenPipeError, ConnectionResetError):
            raise self._closed(what) from None

    def _closed(self, what: str, linger_s: float = 5.0) -> Stop:
        """The failure of a worker whose end of the socket went during `what`: its exit awaited
        briefly, so that the failure says how it died. One still alive `linger_s` later closed the
        socket itself (the candidate's code can reach every descriptor of its process): the
        candidate's failure, never an error of the judge's own."""
        try:
            self.proc.proc.wait(timeout=linger_s)
        except subprocess.TimeoutExpired:
            if not self.candidate_code and not self.trusted:
                return Stop(FC.JUDGE, f"the judge's worker process closed its channel during {what}, before any "
                                      f"of the candidate's code ran, and did not exit:\n{log_excerpt(self.proc)}")
            return Stop(FC.TAMPERING, f"the candidate process closed its channel to the judge during {what} and "
                                      f"did not exit:\n{log_excerpt(self.proc)}")
        return self._died(what)

    def _died(self, what: str) -> Stop:
        """The failure of a worker that died during `what`: the candidate's crash once its code ran,
        the judge's failure before (the harness's own set-up, e.g. a GPU out of memory)."""
        if not self.candidate_code and not self.trusted:
            return Stop(FC.JUDGE, f"the judge's worker process died during {what}, before any of the candidate's "
                                  f"code ran ({self.proc.exit_description()}):\n{log_excerpt(self.proc)}")
        return Stop(FC.CRASH, f"the candidate process died during {what} "
                              f"({self.proc.exit_description()}):\n{log_excerpt(self.proc)}")

    def close(self) -> None:
        try:
            self.chan.send({"op": "exit"})
        except OSError:
            pass
        self.chan.close()
        self.proc.cleanup()
        self.plane.close()
        if self.shared is not None:  # freed only now that the process that mapped it is gone
            self.shared.close()
            self.shared = None


def log_excerpt(proc: Sandboxed) -> str:
    """The end of the worker's log, without the judge's own frames."""
    text = proc.log_tail(3000)
    lines = [ln for ln in text.splitlines() if "cuda_agent/judge" not in ln]
    return "\n".join(lines[-25:])

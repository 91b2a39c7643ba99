"""The calls of one run under the call protocol, from the judge's side: the checked, warm-up and
timed calls of a candidate, a reference check or a baseline, each with fresh inputs revealed only
when its clock starts, and what the judge checks of it (harness.py `Judge` starts the process and
decides what the times say).

Per call: the reference's outputs computed here (`_expect`), the candidate process readied
between calls (`_between_calls`: mode, perturbation, `prepare`), the call itself on the judge's
clocks (`_call`: its inputs written or released, its reply and the outputs and clocks at one
instant, clocks.py), what follows the reply (`_after_reply`), the checks of the call
(`_check_call`: tampering, outputs, inputs, operators and kernels; the precision probe and its
perturbed pairs; a stochastic reference's draws) and the timed call's record (`_record`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field

import torch

from . import launches as ln
from . import policy as pol
from . import stochastic
from .clocks import cpu_ns, own_run_delay_ns, thread_schedstat, waits_during
from .compare import (CEILING_NOISE_MULTIPLE, NOISE_DOMINATED, PROBE_DELTA, PROBE_FLOOR, changed_input,
                      compare_outputs, degenerate_warnings, response_error)
from .config import JudgeConfig
from .devlock import DeviceLock, LockTimeout
from .evaluation import Evaluation, Stop as _Stop
from .memcheck import hold_limit_s
from .protocol import MAX_KERNELS, Bandwidth, CallReply, Echo, KernelList, Reply
from .reference import Reference, Setup, fresh_inputs, perturb_state, reference_draws, set_training, to_list
from .reference import expected64 as reference_expected64
from .session import Session
from .tensorio import TransportError, leaves, pack, perturbed, snapshot, staged, unpack
from .timing import RELEASE_WAIT_S, CacheFlusher, bandwidth_probe, largest_floating
from .verdict import CallRecord, FailureCategory as FC, StochasticCheck, Verdict


def release_call(session: Session, inputs: list, token: int, until: float, what: str):
    """Open a call's gate as the judge (JudgeConfig.gate_release="judge"): wait for the process
    to say that forward has enqueued its work (RELEASE_WAIT_S at most: a forward that waits on
    the host behind the gate gets its release then), write the call's inputs, then the token the
    gate waits for. Returns the moment of the release and, if the process answered with anything
    but `enqueued` (a failed forward), that answer."""
    first = session.recv(min(until, time.monotonic() + RELEASE_WAIT_S), what, CallReply.parse, or_none=True)
    pack(inputs, session.calls, 0, session.plane.in_size)
    if session.shared is not None:
        torch.cuda.synchronize()  # the inputs are in place before the gate opens
    t_release = time.perf_counter()
    session.plane.release(token)
    if first is None:
        first = session.recv(until, what, CallReply.parse)
    return t_release, (None if first.op == "enqueued" and first.ok else first)


@dataclass
class _Call:
    """One call as it goes: what the judge prepared for it, then what it measured of it."""

    index: int
    role: str
    inputs: list
    base: dict | None                 # the call it repeats perturbed (a probe, or a pair's second call)
    state_seed: int | None            # a probe: the seed Model's parameters are moved by
    expected: list | None             # the reference's outputs (None: a baseline's call)
    expected64: list | None
    draws: list | None                # a stochastic reference in training mode: its draws
    training: bool | None             # the mode of a stochastic task's call (None: deterministic)
    protocol_ms: float = 0.0          # the round trip of the untimed `prepare` just before the call
    bounded: bool = False             # CPU backend, a timed call: the threads' bounds are read
    meta: list = field(default_factory=list)  # the inputs' layout as sent
    release: int | None = None        # the token of the judge's release (None: the process opens the gate)
    reply: CallReply | None = None
    at_reply: list | None = None      # the outputs as copied at the reply
    t_reply: float = 0.0
    wall_ms: float = 0.0
    cpu_at_reply: tuple[float, int] | None = None
    cpu_ms: float | None = None
    busiest_ms: float | None = None
    waited_ms: float | None = None
    steady: bool = False

    @property
    def checked(self) -> bool:
        return self.role in ("check", "probe")


class CallLoop:
    """The calls of `session` for `ev` (a candidate, a reference check or a baseline) until
    `deadline`, under `config` on `device`; with `device_lock` (JudgeConfig.device_lock) each call
    holds it, alone if timed."""

    def __init__(self, session: Session, ref: Reference, setup: Setup, ev: Evaluation, deadline: float, *,
                 config: JudgeConfig, device: str, device_lock: DeviceLock | None = None):
        self.session, self.ref, self.setup, self.ev, self.deadline = session, ref, setup, ev, deadline
        self.config, self.device, self.device_lock = config, device, device_lock
        self.judged = ev.judged
        self.inside: list[float] = []
        self.outside: list[float] = []
        self.expected_checks: list[list] = []
        self.idle_wall = self.idle_cpu = 0.0
        self.idle_mark: tuple[float, int] | None = None
        # Where the calls phase goes (reported as phase_s "calls:*"): the judge's own reference
        # work, the candidate's side of each call, the judge's checks, and the wait for a device
        # that other judges share (their timed calls, or theirs waiting for this one's).
        self.split = dict.fromkeys(("reference", "candidate", "check", "device_wait"), 0.0)
        # The precision probe (JudgeConfig.approx_rel_l2): a checked call whose output is over its
        # bound only as far as an approximation may be is repeated on perturbed inputs ("probe",
        # inserted into `roles`); once that passed, warm-up and timed calls come in such pairs.
        self.probe_base: dict | None = None
        self.pair_first: dict | None = None
        # A stochastic reference (stochastic.py): each call's mode (eval: exact check; training:
        # reference draws and the statistical check) and the mode the process was last put in.
        self.stoch = setup.randomness if self.judged else None
        self.mode_sent: bool | None = None
        self.checks_seen = 0
        self.roles: list[str] = []
        self.first_index = 0

    def _lock_limit_s(self) -> float:
        """The longest wait for the device's lock: what other judges may hold it for, several calls at
        their limit or a candidate's runs under compute-sanitizer (memcheck=true on any judge of the
        GPU: minutes). The wait is not the candidate's time (`run` moves its deadline)."""
        return max(4 * self.config.call_timeout_s, hold_limit_s(self.config)) + 30.0

    @contextlib.contextmanager
    def _hold_device(self, exclusive: bool):
        """The device's lock for one call. Every second of waiting, who holds it is looked at: the
        candidate's own process (a lock file of the judge's uid is within its reach when the judge
        is not root) fails it at once; another judge's call lets it go within its own time limit (a
        hung one is killed then), so a wait of several call limits is the judge's failure, never a
        wait without end."""
        limit = self._lock_limit_s()
        until = time.monotonic() + limit
        with contextlib.ExitStack() as held:
            while True:
                try:
                    held.enter_context(self.device_lock.hold(exclusive=exclusive,
                                                             timeout=min(1.0, max(until - time.monotonic(), 0.0))))
                    break
                except LockTimeout as exc:
                    if exc.holders & set(self.session.proc.pids()):
                        raise _Stop(FC.TAMPERING, f"the candidate process holds the judges' GPU lock ({exc})") from None
                    if time.monotonic() >= until:
                        raise _Stop(FC.JUDGE, f"the GPU's judge lock was not free within {limit:.0f} s: {exc}") from None
            yield

    def run(self, roles: list[str], first_index: int = 0, compiling_calls: int = 0) -> tuple[list[float], list[float]]:
        """Run the calls. Every call: fresh inputs revealed only when its clock starts, the output
        compared here (unless `ev` is a baseline), the inputs read back and checked for modification.
        Returns the claimed and the outside-measured times of the timed calls. `first_index`
        numbers the calls of a later round after those of the first. The first `compiling_calls`
        calls compile (a torch.compile baseline's warm-up): they get a build's time limit, not a call's.
        A checked call the precision probe repeats gets its probe inserted into `roles`."""
        cfg = self.config
        self.roles, self.first_index = roles, first_index
        held = contextlib.ExitStack()  # the current call's hold on a device other judges share
        try:
            call = None
            for i, role in enumerate(roles, start=first_index):
                if self.device_lock is not None:
                    held.close()  # the last call's hold; then this one's, alone for a timed call
                    t_wait = time.perf_counter()
                    held.enter_context(self._hold_device(exclusive=role == "timed"))
                    waited = time.perf_counter() - t_wait
                    self.split["device_wait"] += waited
                    self.deadline += waited  # another judge's call is not this candidate's time
                t_ref = time.perf_counter()
                call = self._expect(i, role)
                if self.device == "cuda":
                    torch.cuda.synchronize()
                t_prepare = time.perf_counter()
                self.split["reference"] += t_prepare - t_ref
                self._between_calls(call)
                self._call(call, cfg.build_timeout_s if i - first_index < compiling_calls else cfg.call_timeout_s)
                self.split["candidate"] += call.t_reply - t_prepare
                self._after_reply(call)
                self._record(call)
            self._finish(call)
            return self.inside, self.outside
        finally:
            held.close()

    # ---------------------------------------------------------------------------- one call
    def _expect(self, i: int, role: str) -> _Call:
        """Call `i`'s inputs and the reference's outputs for them (its draws, for a stochastic
        reference's training-mode call; nothing for a baseline's)."""
        cfg, setup, session = self.config, self.setup, self.session
        seed = secrets.randbits(63)
        checked = role in ("check", "probe")
        base = self.probe_base if role == "probe" else \
            self.pair_first if self.judged and session.paired and role in ("warmup", "timed") else None
        inputs = perturbed(base["inputs"], seed, PROBE_DELTA) if base is not None else \
            fresh_inputs(self.ref, seed, i, self.device)
        # a probe moves Model's parameters and buffers too, on both sides: rounded weights would
        # otherwise pass as an approximation of a function linear in its inputs. All of them, not
        # the ones the candidate process says it copied (a claim): a copy it does not move shows.
        moved_keys = list(setup.state_names) if role == "probe" else []
        state_seed = secrets.randbits(31) if role == "probe" else None
        expected = expected64 = draws = None
        training = stochastic_training(self.stoch, role, self.checks_seen)
        self.checks_seen += role == "check"
        if training:
            draws = reference_draws(setup, inputs, stochastic.draw_count(setup.out_bytes))
            expected = draws[0]
        elif self.judged:
            if self.stoch:
                set_training(setup, False)
            if state_seed is not None:
                perturb_state(setup, moved_keys, state_seed, PROBE_DELTA)
            try:
                with torch.no_grad():
                    expected = to_list(setup.ref_model(*inputs))
                if role == "check":
                    self.expected_checks.append([e.detach() if isinstance(e, torch.Tensor) else e for e in expected])
                if checked:
                    expected64 = reference_expected64(setup, inputs, cfg)
            finally:
                if state_seed is not None:
                    perturb_state(setup, moved_keys, None, 0.0)
        return _Call(index=i, role=role, inputs=inputs, base=base, state_seed=state_seed, expected=expected,
                     expected64=expected64, draws=draws, training=training)

    def _between_calls(self, call: _Call) -> None:
        """The process readied for call `i`, untimed: its mode, its parameters moved (a probe) and
        `prepare` (cold caches), whose round trip is the protocol's cost of the moment."""
        session, i = self.session, call.index
        if self.idle_mark is not None:
            # Between calls the candidate has nothing to do; CPU it burns here is work kept out
            # of the timed window (watcher threads, precomputation, starving the judge).
            self.idle_wall += time.perf_counter() - self.idle_mark[0]
            self.idle_cpu += (cpu_ns(session.proc.pid) - self.idle_mark[1]) / 1e9
        if call.training is not None and call.training != self.mode_sent:  # untimed, outside the idle CPU account too
            self.mode_sent = self._set_mode(call.training, i)
        if call.state_seed is not None:  # untimed, and outside the idle CPU account (harness's own work)
            session.send({"op": "perturb", "seed": call.state_seed, "delta": PROBE_DELTA}, f"call {i}")
            self._answer(i)
        t_ask = time.perf_counter()
        session.send({"op": "prepare"}, f"call {i}")
        ready = session.recv(self._until_call(), f"call {i}")
        call.protocol_ms = (time.perf_counter() - t_ask) * 1e3
        if not ready.ok:
            self.ev.reported_error(ready)

    def _call(self, call: _Call, limit_s: float) -> None:
        """The call on the judge's clocks: its inputs written (or released by the judge), its reply,
        and the outputs and every clock at the reply."""
        cfg, dev, session = self.config, self.device, self.session
        plane, proc = session.plane, session.proc
        i, inputs = call.index, call.inputs
        # The clock starts before the inputs exist anywhere the candidate can read them. The
        # bounds reconcile reads for timed calls on the CPU backend: per thread of the candidate
        # its CPU time and the time it waited for a core, and the judge's own wait. The threads
        # are read before the process's CPU clock here and after it below, so that the threads'
        # readings span the process's: only a thread that ended can make the process gain more.
        bounded = call.bounded = dev == "cpu" and call.role == "timed"
        threads_before = thread_schedstat(proc.pid) if bounded else {}
        own_wait_before = own_run_delay_ns() if bounded else 0
        cpu_before = cpu_ns(proc.pid) if dev == "cpu" else 0
        release = call.release = i + 1 if session.judge_release else None
        t_send = time.perf_counter()
        if release is None:
            meta = pack(inputs, session.calls, 0, plane.in_size)
            if session.shared is not None:
                torch.cuda.synchronize()  # the inputs are in place before the process hears of them
            if session.staged:
                # copied into the process's own memory before the clock starts (JudgeConfig.stage_inputs)
                session.send({"op": "stage", "inputs": meta}, f"call {i}")
                self._next_op("staged", i, "stage its inputs")
                t_send = time.perf_counter()
        else:
            meta = pack(inputs, None, 0, plane.in_size)  # the layout now, the bytes at the release
            # staged in host memory now, so that the release's write is an H2D copy of the copy
            # engines rather than kernels of the judge's context beside the candidate's gate
            source = staged(inputs) if cfg.release_writes == "host" else inputs
        call.meta = meta
        # Every call reports the operators it ran (observer.cpp) and the kernels it launched
        # (launches.cpp, host-side callbacks). CUDA's activity records of the kernels that ran
        # are taken on the checked calls only: they add ~20 us of GPU time per kernel on an
        # H200, which would be timed with the kernel.
        session.send({"op": "call", "index": i, "inputs": meta, "kernels": call.checked, "release": release,
                      "staged": session.staged and release is None}, f"call {i}")
        until = min(self.deadline, time.monotonic() + limit_s)
        answered = None
        if release is not None:
            # the judge's clock of the call starts at its release (timing.py)
            t_send, answered = release_call(session, source, release, until, f"call {i}")
        reply = answered if answered is not None else session.recv(until, f"call {i}", CallReply.parse)
        call.t_reply = t_reply = time.perf_counter()
        call.wall_ms = (t_reply - t_send) * 1e3
        call.reply = reply
        # The output and every clock at one instant: the output is copied out of memory the
        # candidate can still write first, and the process's CPU clocks are read after that
        # copy, so that whatever work the copy saw (a thread team that goes on writing after
        # the reply) is on the clock; what it did not see is not judged, and a change after
        # it fails the call (`late_writes`).
        call.at_reply = outputs_at_reply(session, reply) if self.judged and reply.ok else None
        call.cpu_at_reply = (time.perf_counter(), cpu_ns(proc.pid)) if dev == "cpu" else None
        call.cpu_ms = (call.cpu_at_reply[1] - cpu_before) / 1e6 if call.cpu_at_reply is not None else None
        if bounded:
            own_wait_ns = own_run_delay_ns() - own_wait_before
            after = thread_schedstat(proc.pid)
            call.busiest_ms = max((cpu - threads_before.get(tid, (0, 0))[0] for tid, (cpu, _) in after.items()),
                                  default=0) / 1e6
            call.waited_ms, call.steady = waits_during(call.cpu_ms, threads_before, after, own_wait_ns)

    def _after_reply(self, call: _Call) -> None:
        """What follows a call's reply (its error, staged inputs back, the kernels that ran), then
        the judge's checks of the call (unless it is a baseline's)."""
        session, ev, i, role = self.session, self.ev, call.index, call.role
        reply = call.reply
        if not reply.ok:
            ev.reported_error(reply)
        if session.staged and call.release is None and reply.ok:
            # the staged inputs, back in the region after the clock (worker.py), before they are read
            self._next_op("inputs_back", i, "return its staged inputs")
        if self.device == "cuda" and call.checked:
            # the kernels the call launched follow its reply, outside the call's clock (worker.py)
            listed = self._next_op("kernels", i, "list its kernels", KernelList.parse)
            call.reply = reply = reply.with_kernels(listed)  # uncut: the check counts them
        if not self.judged:
            return
        claimed, measured = reply.inside_ms, self._measured(call)
        got, cmp = self._check_call(call, claimed, measured)
        if self.stoch:  # a training-mode call (draws) has no float64 basis, probe or perturbed pair
            stochastic_call(ev.verdict, self.stoch, len(call.draws) if call.draws is not None else 0, cmp)
        base, expected, expected64 = call.base, call.expected, call.expected64
        if call.draws is not None:
            pass
        elif role == "check" and cmp.approximate:
            self.roles.insert(i - self.first_index + 1, "probe")  # the next call repeats this one, perturbed
            self.probe_base = {"inputs": call.inputs, "got": got, "expected": expected, "expected64": expected64,
                               "cmp": cmp}
        elif role == "probe":
            session.send({"op": "restore"}, f"call {i}")  # the parameters as they were, before any later call
            self._answer(i)
            self._probe(i, self.probe_base, got, expected, expected64)
            self.probe_base = None
        elif session.paired and role in ("warmup", "timed"):
            if base is None:
                self.pair_first = {"inputs": call.inputs, "got": got, "expected": expected}
            else:
                check_pair(session, i, role, base, got, expected)
                self.pair_first = None
        late = late_writes(session, reply, call.at_reply)
        if late:
            raise _Stop(FC.TIMING, f"call {i}: {late}")
        self.split["check"] += time.perf_counter() - call.t_reply

    @staticmethod
    def _measured(call: _Call) -> float:
        """The judge's own time of the call: the process's CPU time on the CPU backend, else wall time."""
        return call.cpu_ms if call.cpu_ms is not None else call.wall_ms

    def _record(self, call: _Call) -> None:
        """A timed call's claimed and measured times (and its bounds, on the CPU backend), and where
        the candidate's idle time starts."""
        session, reply = self.session, call.reply
        if call.role == "timed" and reply.inside_ms is not None:
            self.inside.append(reply.inside_ms)
            self.outside.append(self._measured(call))
            session.protocol_ms.append(call.protocol_ms)
            if call.busiest_ms is not None:
                session.busiest_ms.append(call.busiest_ms)
            if call.bounded:
                session.wall_ms.append(call.wall_ms)
                session.waited_ms.append(call.waited_ms)
                session.wall_steady.append(call.steady)
            session.methods.append(reply.timing)
        # On the CPU backend the candidate's idle time starts where its call's clock stopped:
        # CPU it uses while the judge checks the call is counted, not only CPU between calls.
        # A probe's call is left out: its `restore` is the harness's work in that process.
        self.idle_mark = call.cpu_at_reply if call.cpu_at_reply is not None and call.role != "probe" else \
            (time.perf_counter(), cpu_ns(session.proc.pid))

    def _finish(self, last: _Call | None) -> None:
        """After the last call: the run's phases, the stochastic run test, the checked calls'
        warnings, the idle CPU check, enough timed calls, and (a diagnostic) the bandwidth probe."""
        cfg, session, v = self.config, self.session, self.ev.verdict
        if self.judged:
            for k, x in self.split.items():
                if k != "device_wait" or self.device_lock is not None:
                    v.phase_s[f"calls:{k}"] = v.phase_s.get(f"calls:{k}", 0.0) + x
            if self.stoch:
                stochastic_run(v)
            if self.expected_checks:
                # kept: warnings the checked calls raised (an ill-conditioned reference)
                found = degenerate_warnings(self.expected_checks, atol=cfg.atol, rtol=cfg.rtol)
                v.task_warnings = found + [w for w in v.task_warnings if w not in found]
            if self.setup.ref64_problem and cfg.ref_noise_multiple > 0:
                note = f"no float64 reference ({self.setup.ref64_problem}): fixed relative L2 bounds"
                if note not in v.notes:
                    v.notes.append(note)
            if self.idle_cpu > 0.3 * self.idle_wall + 0.02:
                raise _Stop(FC.TIMING, f"the candidate process used {self.idle_cpu * 1e3:.0f} ms of CPU time while it "
                                       f"had no call to serve ({self.idle_wall * 1e3:.0f} ms): work outside the timed "
                                       f"calls")
        if len(self.inside) < 2:
            raise _Stop(FC.JUDGE, "too few timed calls to report a time")
        if self.device == "cuda" and session.shared is not None and os.environ.get("CUDA_AGENT_BANDWIDTH_PROBE") == "1":
            self._bandwidth_probe(leaves(last.inputs))

    # ---------------------------------------------------------------------------- messages
    def _until_call(self) -> float:
        """The deadline of an answer within a call's time limit."""
        return min(self.deadline, time.monotonic() + self.config.call_timeout_s)

    def _answer(self, i: int) -> Reply:
        """The answer to an untimed request in call `i`; an error reply ends the run as reported."""
        done = self.session.recv(self._until_call(), f"call {i}")
        if not done.ok:
            self.ev.reported_error(done)
        return done

    def _set_mode(self, training: bool, i: int) -> bool:
        """A stochastic task's candidate put in training mode (its modules' flags as constructed) or
        eval mode before call `i` (worker.py's "mode"); returns the mode set."""
        self.session.send({"op": "mode", "training": training}, f"call {i}")
        self._answer(i)
        return training

    def _next_op(self, op: str, i: int, what: str, parse=Reply.parse):
        """The message that must come next in call `i` (the worker's `op`), within a call's time
        limit: an error reply ends the run as reported, any other message is tampering."""
        got = self.session.recv(self._until_call(), f"call {i}", parse)
        if not got.ok:
            self.ev.reported_error(got)
        if got.op != op:
            raise _Stop(FC.TAMPERING, f"call {i}: the candidate process did not {what}")
        return got

    def _bandwidth_probe(self, inputs: list) -> None:
        """timing.bandwidth_probe in the candidate process and in the judge's own, on the largest
        input of the last call, noted in the verdict (a diagnostic of memory-bound timing)."""
        self.session.send({"op": "bandwidth"}, "bandwidth probe")
        got = self.session.recv(min(self.deadline, time.monotonic() + self.config.call_timeout_s), "bandwidth probe",
                                Bandwidth.parse)
        mine: dict = {}
        big = largest_floating(inputs)
        if big is not None:
            mine = bandwidth_probe(big.to("cuda"), CacheFlusher("cuda"))
        self.ev.verdict.notes.append("bandwidth probe (ms): " + json.dumps({"process": got.result, "judge": mine}))

    # ---------------------------------------------------------------------------- checks
    def _check_call(self, call: _Call, claimed: float | None, measured: float) -> tuple[list, object]:
        """A call's checks, its record in the verdict, and its outputs and comparison (`got` the
        outputs as taken at the reply, `outputs_at_reply`; None reads them here)."""
        cfg, session, ev = self.config, self.session, self.ev
        plane, v = session.plane, ev.verdict
        i, role, reply, got = call.index, call.role, call.reply, call.at_reply
        expected, expected64, draws = call.expected, call.expected64, call.draws
        # Tampering first: a changed global flag or a replaced function can also change the outputs
        # (lower matmul precision, for one, on CPUs with AMX), and then the verdict must name the cause.
        known = len(v.policy_violations)
        ev.note_blocked(reply)
        if len(v.policy_violations) > known:  # the sandbox refused something during this call
            raise _Stop(FC.POLICY, v.policy_violations[known])
        tampered = reply.tampered
        if tampered:
            v.policy_violations.append(f"forward replaced library functions: {', '.join(tampered[:5])}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])
        changed = reply.flags_changed
        if changed:
            v.policy_violations.append(f"forward changed global numeric settings: {', '.join(changed)}")
            raise _Stop(FC.TAMPERING, v.policy_violations[-1])
        if got is None:
            try:
                got = unpack(reply.outputs, session.calls, plane.out_offset, plane.out_size,
                             self.device if session.shared is not None else "cpu")
            except TransportError as exc:
                raise _Stop(FC.MISMATCH, f"call {i}: unusable output: {exc}") from None
            if session.shared is not None:  # views of memory the candidate can still write: snapshot first
                got = [snapshot(g) for g in got]
        if draws is not None:  # a stochastic reference in training mode: judged as one more draw
            cmp = stochastic.compare_draws(draws, got)
        else:
            cmp = compare_outputs(expected, got, atol=cfg.atol, rtol=cfg.rtol, max_rel_l2=cfg.max_rel_l2,
                                  expected64=expected64, noise_multiple=cfg.ref_noise_multiple,
                                  rel_l2_ceiling=cfg.max_rel_l2_ceiling,
                                  rel_l2_bounds=None if role in ("check", "probe") else session.rel_l2_bounds,
                                  approx_ceiling=cfg.approx_rel_l2 if role in ("check", "probe") else 0.0)
        if role in ("check", "probe") and draws is None:
            # Later calls (no float64 reference) keep the widest bound the checked calls found.
            old = session.rel_l2_bounds or [None] * len(cmp.later_bounds)
            session.rel_l2_bounds = [b if a is None else a if b is None else max(a, b)
                                     for a, b in zip(old, cmp.later_bounds)] or None
            if cmp.rel_l2_err_f64 is not None:
                v.max_rel_l2_err_f64 = max(v.max_rel_l2_err_f64 or 0.0, cmp.rel_l2_err_f64)
            if cmp.ref_noise_rel_l2 is not None:
                v.ref_noise_rel_l2 = max(v.ref_noise_rel_l2 or 0.0, cmp.ref_noise_rel_l2)
            if cmp.rel_l2_bound is not None:
                v.rel_l2_bound = min(v.rel_l2_bound, cmp.rel_l2_bound) if v.rel_l2_bound is not None \
                    else cmp.rel_l2_bound
            if cmp.noise_dominated:
                outs = ", ".join(map(str, cmp.noise_dominated))
                note = (f"output(s) {outs}: the reference's values are rounding noise (its own error against "
                        f"float64 is {NOISE_DOMINATED:.0%} or more of the output), so no relative L2 bound "
                        f"applies; the elementwise tolerance alone decides")
                if note not in v.notes:
                    v.notes.append(note)
            if cmp.over_ceiling:
                outs = ", ".join(map(str, cmp.over_ceiling))
                warning = (f"output(s) {outs}: ill-conditioned: the reference's own error against float64 exceeds "
                           f"the ceiling {cfg.max_rel_l2_ceiling:g}, so the bound is the ceiling plus "
                           f"{min(cfg.ref_noise_multiple, CEILING_NOISE_MULTIPLE):g}x that error")
                if warning not in v.task_warnings:
                    v.task_warnings.append(warning)
        if cmp.ok and len(expected) == 1 and isinstance(expected[0], torch.Tensor) \
                and reply.structure != "tensor":
            cmp = type(cmp)(False, f"output is a {reply.structure}, expected a single tensor")
        v.max_abs_err = max(v.max_abs_err or 0.0, cmp.max_abs_err)
        v.max_rel_l2_err = max(v.max_rel_l2_err or 0.0, cmp.rel_l2_err)
        v.calls.append(CallRecord(index=i, role=role, inside_ms=claimed, outside_ms=measured,
                                  stream_ms=reply.stream_ms, lag_ms=reply.lag_ms, run_delay_ms=reply.run_delay_ms,
                                  kernel_ms=reply.kernel_ms,
                                  max_abs_err=cmp.max_abs_err, rel_l2_err=cmp.rel_l2_err,
                                  rel_l2_err_f64=cmp.rel_l2_err_f64, ref_noise_rel_l2=cmp.ref_noise_rel_l2,
                                  rel_l2_bound=cmp.rel_l2_bound, ok=cmp.ok))
        if not cmp.ok:
            mode = ", eval mode: the random part switched off" if call.training is False else ""
            raise _Stop(FC.MISMATCH, f"call {i} ({'checked' if role == 'check' else role}{mode}): {cmp.message}")
        if cmp.approximate and role == "check" and not session.paired:
            # an approximation or lower precision: the precision probe (the next call) decides
            err = cmp.rel_l2_err_f64
            v.notes.append(f"call {i}: output(s) {', '.join(map(str, cmp.approximate))} over the noise-scaled bound "
                           f"(error {err:.3g} against float64, bound {cmp.rel_l2_bound:.3g}) but within "
                           f"approx_rel_l2 {cfg.approx_rel_l2:g}: repeated on inputs moved by 2^-8 (precision probe)")
        v.n_checked += 1
        # Every call's inputs come back (after its clock stopped) and are compared with what was sent.
        check_echo(call.inputs, self._inputs_back(call), i)
        found = self._policy_findings(i, reply)
        if found:
            v.policy_violations.extend(found)
            raise _Stop(FC.POLICY, found[0])
        return got, cmp

    def _inputs_back(self, call: _Call) -> list:
        """Call `i`'s inputs as forward left them: read in place where the process got views of
        them (the shared GPU region; the host plane on the CPU backend), asked for otherwise (CUDA
        without GPU sharing copies them over)."""
        session, i, meta = self.session, call.index, call.meta
        plane = session.plane
        if session.shared is not None:
            return unpack(meta, session.calls, 0, plane.in_size, self.device)
        if self.device == "cpu":
            return unpack(meta, plane.view, 0, plane.in_size)
        session.send({"op": "echo"}, f"call {i}")
        echo = session.recv(self._until_call(), f"call {i}", Echo.parse)
        if not echo.ok:
            raise _Stop(FC.RUNTIME, f"call {i}: reading back the inputs failed: {str(echo.message)[:500]}")
        try:
            return unpack(echo.echo, plane.view, 0, plane.in_size)
        except TransportError:
            raise _Stop(FC.MISMATCH, f"call {i}: the candidate process did not return its inputs") from None

    def _policy_findings(self, i: int, reply: CallReply) -> list[str]:
        """What the policy finds in every call's operators and launched kernels, checked, warm-up
        and timed alike (nothing for a trusted run)."""
        cfg = self.config
        if self.session.trusted:
            return []
        found = pol.check_dispatched(reply.ops, cfg.policy)
        kernels = reply.launched + reply.kernels  # launched (every call), ran (checked)
        found += pol.check_kernels(kernels, cfg.policy)
        # and by who issued them (PyTorch, directly or through cuBLAS; a vendor library the task does not allow)
        if reply.owners is not None:
            found += ln.check_kernel_owners(reply.owners, cfg.policy, self.ev.vendor, ln.torch_dir())
        if any(n > MAX_KERNELS for n in (reply.launched_sent, reply.kernels_sent)):
            found.append(f"call {i} launched more than {MAX_KERNELS} distinct kernels (too many to check)")
        return found

    def _probe(self, i: int, base: dict, got: list, expected: list, expected64: list | None) -> None:
        """The precision probe: call `i` repeated the checked call `base` with its inputs, and the
        parameters the candidate process copied from Model (here and there), moved by PROBE_DELTA;
        the parameters are back as they were. For each output over its bound there, the candidate's change of output must agree
        with float64's as closely as float32 arithmetic allows (an approximation follows the change;
        rounding to fewer bits loses it). Passed: later warm-up and timed calls come in such pairs,
        each pair checked against the float32 reference's change (`session.paired`)."""
        cfg, session, ev = self.config, self.session, self.ev
        cmp = base["cmp"]
        paired = dict(session.paired or {})
        for k in cmp.approximate:
            if expected64 is None or base["expected64"] is None:
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): no float64 reference to check output {k} "
                                         f"against, so its error over the bound stands")
            if torch.equal(base["expected64"][k], expected64[k]):
                # no floating input reaches this output: the probe cannot show resolution, so the
                # error over the bound stands
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): output {k} does not change with the inputs and "
                                         f"the parameters copied from Model moved by 2^-8, so the probe cannot tell an approximation from lower precision: "
                                         f"its error against float64, {cmp.rel_l2_err_f64:.3g}, exceeds the bound "
                                         f"{cmp.rel_l2_bound:.3g}")
            e = response_error(base["got"][k], got[k], base["expected64"][k], expected64[k])
            noise = response_error(base["expected"][k], expected[k], base["expected64"][k], expected64[k])
            bound = max(PROBE_FLOOR, cfg.ref_noise_multiple * noise)
            if not e <= bound:
                raise _Stop(FC.MISMATCH, f"call {i} (precision probe): output {k}: with the inputs and parameters moved by 2^-8, its "
                                         f"change differs from float64's by {e:.3g} (relative L2; bound {bound:.3g} = "
                                         f"max({PROBE_FLOOR:g}, {cfg.ref_noise_multiple:g} x {noise:.3g}), the float32 "
                                         f"reference's own): lower precision than the task, not an approximation "
                                         f"(its error against float64 was {cmp.rel_l2_err_f64:.3g}, over the bound "
                                         f"{cmp.rel_l2_bound:.3g})")
            # the pairs are checked against the float32 reference's change, itself `noise` from float64's
            if k not in paired:
                ev.verdict.notes.append(
                    f"output {k}: an approximation at float32 resolution (precision probe: change {e:.3g} from "
                    f"float64's, bound {bound:.3g}); warm-up and timed calls then came in perturbed pairs")
            paired[k] = max(paired.get(k, 0.0), bound + noise)
        session.paired = paired


def check_pair(session: Session, i: int, role: str, first: dict, got: list, expected: list) -> None:
        """The second call of a warm-up or timed pair (after the precision probe passed): its change
        from the first must follow the float32 reference's as the probe's did."""
        for k, bound in (session.paired or {}).items():
            e = response_error(first["got"][k], got[k], first["expected"][k], expected[k])
            if not e <= bound:
                raise _Stop(FC.MISMATCH, f"call {i} ({role}): output {k}: with the last call's inputs moved by 2^-8, "
                                         f"its change differs from the reference's by {e:.3g} (relative L2; bound "
                                         f"{bound:.3g}, from the precision probe): lower precision than the task on "
                                         f"the calls after the checked ones")


def check_echo(sent: list, back: list, i: int) -> None:
    """Call `i`'s inputs as they came back, against what was sent: forward must not modify them."""
    if len(back) != len(sent):
        raise _Stop(FC.MISMATCH, f"call {i}: the candidate process returned {len(back)} inputs, not {len(sent)}")
    changed = changed_input(sent, back)
    if changed:
        raise _Stop(FC.MISMATCH, f"call {i}: forward modified {changed} in place")


def outputs_at_reply(session: Session, reply: CallReply, private: bool = True) -> list | None:
    """A private copy of a call's outputs, taken as soon as the reply is read (the data plane, and
    on CUDA the GPU region, stay writable by the candidate process). None where the reply's
    layout is unusable: the check then reads it again and fails the call with the reason.
    `private` False: views of the GPU region where there is one (the host plane is always copied)."""
    plane = session.plane
    try:
        got = unpack(reply.outputs, session.calls, plane.out_offset, plane.out_size,
                     "cuda" if session.shared is not None else "cpu")
    except TransportError:
        return None
    if session.shared is not None and private:
        got = [snapshot(g) for g in got]
        torch.cuda.synchronize()  # the copy complete now, not whenever the check reads it
    return got


def late_writes(session: Session, reply: CallReply, at_reply: list | None) -> str | None:
    """Why the outputs in the candidate's reach differ from the copy taken at the reply (work that
    went on after the call answered), or None. Compared bytewise, so NaN outputs compare too."""
    if at_reply is None:
        return None
    now = outputs_at_reply(session, reply, private=False)  # read once, no second copy of the outputs
    if now is None or len(now) != len(at_reply):
        return "the output's layout changed after the reply"
    for k, (a, b) in enumerate(zip(leaves(at_reply), leaves(now))):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            same = a.shape == b.shape and a.dtype == b.dtype and (
                a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
            if not same:
                return (f"output {k} changed after the call replied: work that finished after the reply is "
                        f"outside the call's clock")
    return None


def stochastic_training(kind: str | None, role: str, checks_seen: int) -> bool | None:
    """The mode of a call under a stochastic reference (None: a deterministic one). With `kind`
    "eval", every other checked call (the first included) and the precision probe that may follow
    it run in eval mode, checked exactly; the other checked calls and every warm-up and timed call
    run in training mode, as the task does, checked statistically. With "always", all of them."""
    if kind is None:
        return None
    if kind == "eval" and (role == "probe" or role == "check" and checks_seen % 2 == 0):
        return False
    return True


def stochastic_call(v: Verdict, kind: str, drawn: int, cmp) -> None:
    """A passed call of a stochastic task (`drawn`: the reference draws it was checked against, 0
    for an eval-mode call), recorded in the verdict (`Verdict.stochastic`)."""
    s = v.stochastic
    if s is None:
        s = v.stochastic = StochasticCheck(kind=kind)
        v.notes.append(
            "stochastic reference (its outputs change with the random seed): "
            + ("checked exactly in eval mode (random part off) on every other checked call, "
               if kind == "eval" else "eval() does not switch its random part off, so no call is checked exactly; ")
            + "in training mode each output judged as one more draw against the reference's own draws "
              "(per-element ranks, Kolmogorov-Smirnov, and a spread z-score added up over the run)")
    if not drawn:
        s.eval_calls += 1
        return
    s.draw_calls += 1
    s.draws = min(s.draws, drawn) if s.draws else drawn
    if cmp.draws_ks is not None and (s.worst_ks is None or cmp.draws_ks / cmp.draws_ks_bound
                                     > s.worst_ks / s.worst_ks_bound):
        s.worst_ks, s.worst_ks_bound = cmp.draws_ks, cmp.draws_ks_bound
    for k, z in enumerate(cmp.draws_z):
        if k >= len(s.z_sum):
            s.z_sum.append(0.0)
            s.z_calls.append(0)
            s.ks_r_sum.append(0.0)
        s.z_sum[k] += z
        s.z_calls[k] += 1
        s.ks_r_sum[k] += cmp.draws_ks_r[k] if k < len(cmp.draws_ks_r) else 0.0


def stochastic_run(v: Verdict) -> None:
    """The rank and spread tests over all the training-mode calls so far (stochastic.run_ks_bound,
    stochastic.Z_RUN)."""
    s = v.stochastic
    if s is None:
        return
    for k, (total, n) in enumerate(zip(s.ks_r_sum, s.z_calls)):
        bound = stochastic.run_ks_bound(n)
        if bound is not None and total / n > bound:
            raise _Stop(FC.MISMATCH, f"output {k}: not distributed like the stochastic reference over the run: the "
                                     f"Kolmogorov-Smirnov distance of its ranks among the reference's draws is "
                                     f"{total / n:.3g}x the draws' own on average over {n} training-mode calls "
                                     f"(bound {bound:.3g}): the random part left out, replaced by its expectation, "
                                     f"or drawn from another distribution")
    for k, (total, n) in enumerate(zip(s.z_sum, s.z_calls)):
        z = total / math.sqrt(n) if n else 0.0
        if abs(z) > stochastic.Z_RUN:
            raise _Stop(FC.MISMATCH, f"output {k}: not distributed like the stochastic reference over the run: its mean "
                                     f"L1 distance to the reference's draws is {z:+.3g} standard deviations from a draw's "
                                     f"own, summed over {n} training-mode calls (bound {stochastic.Z_RUN:g}): "
                                     + ("too close to the draws: the random part left out or replaced by its expectation"
                                        if z < 0 else "too far from the draws: a wrong distribution"))

"""The trusted side of the judge: builds, references, inputs, comparisons, timing decisions.

Data flow of one evaluation:

    static policy -> build (sandboxed compiler, cached) -> candidate process starts, builds
    ModelNew (weights copied from Model) -> for every call: fresh inputs from a secret seed,
    reference output computed here, candidate output received as bytes and compared here ->
    the candidate's times checked against this process's clock -> baselines -> Verdict -> reward

The candidate process never holds a reference output, a seed of an input it has not yet been
given, or anything that decides the verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shutil
import socket
import statistics
import time
import types
from pathlib import Path

import torch

from cuda_agent.candidate import Candidate
from cuda_agent.reward import reward_of
from cuda_agent.tasks import Task

from . import policy as pol
from .build import Builder, BuildError, BuildSpec, inline_spec, workspace_spec
from .compare import compare_outputs, degenerate_warnings
from .config import JudgeConfig
from .protocol import Channel, ChannelClosed, ChannelTimeout, DataPlane, ProtocolError
from .sandbox import SandboxSpec, Sandboxed, Zygote, is_root, new_workdir, python_argv
from .tensorio import TransportError, nbytes_of, pack, unpack
from .timing import CacheFlusher, CallTimer, reconcile, summarize
from .verdict import CallRecord, Failure, FailureCategory as FC, Timing, Verdict


class JudgeError(RuntimeError):
    """The judge cannot work (bad configuration, missing device, broken task). Not a verdict."""


class _Stop(Exception):
    """Ends an evaluation early with a failure."""

    def __init__(self, category: FC, message: str):
        super().__init__(message)
        self.failure = Failure(category=category, message=message[-6000:])


def _package_files() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".h", ".cpp"} and "suite" not in path.parts:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _work_root() -> Path:
    root = Path(os.environ.get("CUDA_AGENT_WORK", f"/var/tmp/cuda-agent-{os.geteuid()}"))
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    return root


class _Reference:
    """A task's reference module, loaded once in the judge's own process."""

    def __init__(self, task: Task):
        module = types.ModuleType(f"reference_{task.id}")
        try:
            exec(compile(task.source, task.origin or task.name, "exec"), module.__dict__)
        except Exception as exc:
            raise JudgeError(f"task {task.name}: the reference does not import: {type(exc).__name__}: {exc}") from None
        self.Model = module.Model
        self.get_inputs = module.get_inputs
        self.get_init_inputs = module.get_init_inputs


def _to_list(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


class Judge:
    """A long-lived judge. `evaluate` never raises for a candidate's faults: it returns a Verdict."""

    def __init__(self, config: JudgeConfig | None = None):
        self.config = config = config or JudgeConfig()
        self.device = config.device
        if self.device == "cuda" and not torch.cuda.is_available():
            raise JudgeError("device 'cuda' requested but CUDA is not available (use --device cpu)")
        self.device_name = (torch.cuda.get_device_name(0) if self.device == "cuda"
                            else f"cpu x{os.cpu_count()}")
        self._cores = len(os.sched_getaffinity(0)) or 1
        arch = config.arch
        if self.device == "cuda" and arch is None:
            major, minor = torch.cuda.get_device_capability(0)
            arch = f"{major}.{minor}"
        self.arch = arch
        self.uid = (config.sandbox_uid or 61000 + os.getpid() % 4000) if is_root() else None
        self.work_root = _work_root()
        self._zygote: Zygote | None = None
        # Builds run under their own uid: cleaning up after a build kills every process of its uid,
        # which must never include the candidate process waiting for that build.
        self.builder = Builder(config.cache_dir, self.work_root, arch=arch, timeout_s=config.build_timeout_s,
                               uid=None if self.uid is None else self.uid + 5000, zygote=self._get_zygote)
        self.baseline_dir = config.cache_dir / "baselines"
        self.baseline_dir.mkdir(parents=True, exist_ok=True)
        self._integrity = _package_files()
        self._references: dict[str, _Reference] = {}
        self._compiled_timing: dict[str, Timing] = {}
        self._flusher: CacheFlusher | None = None
        self._timer: CallTimer | None = None
        self._rtt_ms: float | None = None

    # -------------------------------------------------------------------------------- public
    def evaluate(self, task: Task, candidate: Candidate) -> Verdict:
        t0 = time.monotonic()
        verdict = Verdict(task_id=task.id, task_name=task.name, candidate_hash=candidate.hash,
                          device=self.device, device_name=self.device_name,
                          compile_mode=None if self.config.compile_mode == "none" else self.config.compile_mode,
                          versions={"torch": torch.__version__, "cuda": str(torch.version.cuda)})
        self._live: list[Sandboxed] = []
        try:
            self._evaluate(task, candidate, verdict, t0)
        except _Stop as stop:
            verdict.failure = stop.failure
            if stop.failure.category == FC.POLICY and not verdict.policy_violations:
                verdict.policy_violations.append(stop.failure.message)
        except JudgeError:
            raise
        except Exception as exc:  # a bug of the judge, reported as such and never blamed on the candidate
            import traceback

            verdict.failure = Failure(category=FC.JUDGE, message="".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
        finally:
            for proc in self._live:
                proc.cleanup()
            self._live = []
        if self._integrity != _package_files():
            verdict.failure = Failure(category=FC.TAMPERING, message="the judge's own files changed during the run")
            self._integrity = _package_files()
        if verdict.failure is not None:
            verdict.correct = False
        verdict.judge_s = time.monotonic() - t0
        r = reward_of(verdict, self.config.reward)
        verdict.reward, verdict.reward_reason = r.value, r.reason
        return verdict

    def close(self) -> None:
        self._references.clear()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- steps
    def _evaluate(self, task: Task, cand: Candidate, v: Verdict, t0: float):
        cfg = self.config
        deadline = t0 + cfg.total_timeout_s
        self._static_checks(cand, v)

        library = None
        if cand.kind == "workspace":
            spec = self._workspace_spec(cand)
            library = self._build(spec, v)
        else:
            v.compiled = True  # set back to False if a load_inline build fails

        ref = self._reference(task)
        init_seed = secrets.randbits(31)
        call_seeds = [secrets.randbits(63) for _ in range(cfg.n_check + cfg.n_warmup + cfg.n_timed)]
        v.seeds = {"init": init_seed}
        dev = self.device
        torch.manual_seed(init_seed)
        init_args = list(ref.get_init_inputs())
        ref_model = ref.Model(*init_args).to(dev)
        state_names, state_values = zip(*ref_model.state_dict().items()) if ref_model.state_dict() else ((), ())
        state_values = [t.detach().cpu() for t in state_values]

        sample_inputs = self._inputs(ref, call_seeds[0], 0)
        with torch.no_grad():
            expected_probe = _to_list(ref_model(*sample_inputs))
        out_bytes = nbytes_of(expected_probe)
        sample_bytes = nbytes_of(sample_inputs)
        del sample_inputs, expected_probe
        if out_bytes > cfg.max_output_mb << 20:
            raise JudgeError(f"task {task.name}: reference output of {out_bytes >> 20} MiB exceeds max_output_mb")
        in_bytes = max(nbytes_of(state_values) + nbytes_of(init_args), 0) + (1 << 20)
        in_bytes = max(in_bytes, sample_bytes + (1 << 20))
        # The output half holds exactly what a correct candidate returns (plus slack); anything
        # larger is wrong anyway and is reported as such by the candidate's own harness.
        plane = DataPlane.create(in_bytes, out_bytes + (1 << 20))
        self._pin(plane)
        proc = None
        try:
            poison = out_bytes if dev == "cuda" else 0
            t_phase = time.monotonic()
            compiled_timing = self._compiled_baseline(task, ref, ref_model) if cfg.compile_mode != "none" else None
            v.phase_s["baseline"] = time.monotonic() - t_phase
            v.compiled_ref = compiled_timing

            t_phase = time.monotonic()
            proc, chan = self._spawn(task, cand, plane, library, v)
            init_meta = pack(init_args, plane.view, 0, plane.in_size)
            init_end = max([m["offset"] + m.get("nbytes", 0) for m in init_meta if m["t"] == "tensor"] + [0])
            state_meta = pack(state_values, plane.view, (init_end + 63) // 64 * 64,
                              plane.in_size - init_end - 64)
            chan.send({"device": dev, "candidate_path": str(proc.spec.workdir / "model_new.py"),
                       "reference_path": str(proc.spec.workdir / "model.py"),
                       "library": str(proc.spec.workdir / "cuda_extension.so") if library else None,
                       "init_args": init_meta, "state": state_meta, "state_names": list(state_names),
                       "init_seed": init_seed, "flush": cfg.flush_l2, "poison_bytes": poison})
            ready = self._serve_init(chan, proc, v, min(deadline, time.monotonic() + cfg.init_timeout_s))
            proc.probe_isolation()
            v.phase_s["start"] = time.monotonic() - t_phase - (v.phase_s.get("build") or 0.0)
            if ready.get("unmatched"):
                v.notes.append(f"parameters not copied from Model (different name or shape): "
                               f"{', '.join(ready['unmatched'][:8])}")
            t_phase = time.monotonic()
            self._run_calls(ref, ref_model, chan, proc, plane, call_seeds, v, deadline)
            v.phase_s["calls"] = time.monotonic() - t_phase
            try:
                chan.send({"op": "exit"})
            except OSError:
                pass
        finally:
            plane.close()
            if proc is not None:
                v.isolation = proc.isolation

    def _static_checks(self, cand: Candidate, v: Verdict) -> None:
        import ast

        try:
            tree = ast.parse(cand.model_new)
        except SyntaxError as exc:
            raise _Stop(FC.LOAD, f"model_new: syntax error at line {exc.lineno}: {exc.msg}") from None
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            raise _Stop(FC.LOAD, "the candidate defines no class ModelNew at module level")
        violations = pol.check_python(cand.model_new, self.config.policy)
        for rel, src in cand.kernels:
            violations += pol.check_cpp(src, f"kernels/{rel}", self.config.policy)
        if violations:
            v.policy_violations.extend(violations)
            raise _Stop(FC.POLICY, violations[0])

    def _workspace_spec(self, cand: Candidate) -> BuildSpec:
        slot = f"ws:{cand.origin}" if cand.origin and cand.origin != "<memory>" else f"ws:{cand.hash}"
        try:
            return workspace_spec(cand.kernels, slot, self.device)
        except BuildError as exc:
            raise _Stop(FC.LOAD, str(exc)) from None

    def _build(self, spec: BuildSpec, v: Verdict) -> Path:
        try:
            result = self.builder.build(spec)
        except BuildError as exc:
            v.compiled = False
            raise _Stop(FC.COMPILE_TIMEOUT if exc.timeout else FC.COMPILE, str(exc)) from None
        v.compiled = True
        v.build_s = (v.build_s or 0.0) + result.seconds
        v.phase_s["build"] = v.build_s
        v.build_cached = result.cached if v.build_cached is None else (v.build_cached and result.cached)
        return result.library

    def _reference(self, task: Task) -> _Reference:
        ref = self._references.get(task.id)
        if ref is None:
            ref = self._references[task.id] = _Reference(task)
        return ref

    def _spawn(self, task: Task, cand: Candidate, plane: DataPlane, library: Path | None, v: Verdict):
        workdir = new_workdir(self.work_root / "runs", "cand-")
        (workdir / "model_new.py").write_text(cand.model_new)
        (workdir / "model.py").write_text(task.source)
        if library is not None:
            shutil.copy2(library, workdir / "cuda_extension.so")
        parent_sock, child_sock = socket.socketpair()
        env = {}
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            # idle OpenMP threads must sleep, not spin: spinning would be charged to the next call
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        spec = SandboxSpec(
            argv=python_argv("cuda_agent.judge.worker", str(child_sock.fileno()), str(plane.fd),
                             str(plane.size), str(plane.in_size)),
            workdir=workdir, uid=self.uid, pass_fds=(child_sock.fileno(), plane.fd), env=env,
            address_space_mb=(self.config.memory_limit_mb + 8192) if self.device == "cpu" else None,
            target="worker", target_args=[plane.size, plane.in_size])
        try:
            proc = Sandboxed(spec, self._get_zygote())
        finally:
            child_sock.close()
        self._live.append(proc)
        return proc, Channel(parent_sock)

    def _recv(self, chan: Channel, proc: Sandboxed, deadline: float, what: str) -> dict:
        """Wait for a message while watching the process's health and memory."""
        limit = self.config.memory_limit_mb
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Stop(FC.TIMEOUT, f"{what} did not finish within its time limit")
            try:
                return chan.recv(timeout=min(remaining, 0.25))
            except ChannelTimeout:
                pass
            except ChannelClosed:
                proc.proc.wait(timeout=5) if proc.proc.poll() is None else None
                raise _Stop(FC.CRASH, f"the candidate process died during {what} "
                                      f"({proc.exit_description()}):\n{_log_excerpt(proc)}") from None
            except ProtocolError as exc:
                raise _Stop(FC.TAMPERING, f"malformed message from the candidate process: {exc}") from None
            if not proc.alive():
                raise _Stop(FC.CRASH, f"the candidate process died during {what} "
                                      f"({proc.exit_description()}):\n{_log_excerpt(proc)}")
            if proc.rss_mb() > limit:
                raise _Stop(FC.OOM, f"the candidate process exceeded {limit} MiB of host memory during {what}")

    def _serve_init(self, chan: Channel, proc: Sandboxed, v: Verdict, deadline: float) -> dict:
        while True:
            msg = self._recv(chan, proc, deadline, "loading the candidate")
            if msg.get("op") == "build":
                chan.send(self._serve_build(msg, proc, v))
                continue
            if not msg.get("ok"):
                self._raise_reported(msg, v)
            self._blocked(msg, v)
            return msg

    def _serve_build(self, msg: dict, proc: Sandboxed, v: Verdict) -> dict:
        def text_list(x):
            if x is None:
                return []
            return [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple)) else [str(x)]

        try:
            spec = inline_spec(
                name=str(msg.get("name")), cpp_sources=text_list(msg.get("cpp_sources")),
                cuda_sources=text_list(msg.get("cuda_sources")), functions=msg.get("functions"),
                cflags=[str(f) for f in text_list(msg.get("cflags"))],
                cuda_cflags=[str(f) for f in text_list(msg.get("cuda_cflags"))],
                ldflags=[str(f) for f in text_list(msg.get("ldflags"))],
                with_cuda=msg.get("with_cuda") if isinstance(msg.get("with_cuda"), bool) else None,
                with_pytorch_error_handling=bool(msg.get("with_pytorch_error_handling", True)))
        except BuildError as exc:
            v._build_failure = Failure(category=FC.COMPILE, message=str(exc))  # type: ignore[attr-defined]
            return {"ok": False, "message": str(exc)}
        if self.device == "cpu" and spec.with_cuda:
            msg_text = "CUDA sources cannot be built for the CPU backend"
            v._build_failure = Failure(category=FC.COMPILE, message=msg_text)  # type: ignore[attr-defined]
            return {"ok": False, "message": msg_text}
        violations = []
        for rel, src in spec.sources:
            violations += pol.check_cpp(src, f"{spec.name}/{rel}", self.config.policy)
        if violations:
            v.policy_violations.extend(violations)
            return {"ok": False, "message": "policy: " + violations[0]}
        try:
            library = self._build(spec, v)
        except _Stop as stop:
            v._build_failure = stop.failure  # type: ignore[attr-defined]
            return {"ok": False, "message": stop.failure.message}
        dest = proc.spec.workdir / f"lib_{spec.name}.so"
        shutil.copy2(library, dest)
        if proc.uid is not None:
            os.chown(dest, proc.uid, proc.uid)
        return {"ok": True, "library": str(dest)}

    def _raise_reported(self, msg: dict, v: Verdict) -> None:
        self._blocked(msg, v)
        if v.policy_violations:
            raise _Stop(FC.POLICY, v.policy_violations[0])
        build_failure = getattr(v, "_build_failure", None)
        if build_failure is not None:
            v.compiled = False
            raise _Stop(build_failure.category, build_failure.message)
        category = {"load": FC.LOAD, "init": FC.INIT, "runtime": FC.RUNTIME, "oom": FC.OOM}.get(
            str(msg.get("category")), FC.RUNTIME)
        raise _Stop(category, str(msg.get("message", "the candidate reported an error"))[:6000])

    @staticmethod
    def _blocked(msg: dict, v: Verdict) -> None:
        blocked = msg.get("blocked") or []
        if isinstance(blocked, list) and blocked:
            for b in blocked[:5]:
                text = f"the sandbox refused: {str(b)[:200]}"
                if text not in v.policy_violations:
                    v.policy_violations.append(text)

    # -------------------------------------------------------------------------------- calls
    def _inputs(self, ref: _Reference, seed: int, index: int) -> list:
        """A fresh input set: the task's own distribution under a secret seed, rescaled on some calls
        so that a kernel tuned to one value range is still checked on another."""
        torch.manual_seed(seed)
        # Drawn on the device: the task's own distribution, without a slow host-side generator.
        with torch.device(self.device):
            inputs = list(ref.get_inputs())
        if index % 3 == 1:
            rng = random.Random(seed)
            inputs = [x * rng.uniform(0.25, 1.0) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
        return inputs

    def _run_calls(self, ref: _Reference, ref_model, chan: Channel, proc: Sandboxed, plane: DataPlane,
                   seeds: list[int], v: Verdict, deadline: float) -> None:
        cfg = self.config
        dev = self.device
        n = len(seeds)
        roles = ["check"] * cfg.n_check + ["warmup"] * cfg.n_warmup + ["timed"] * cfg.n_timed
        rng = random.Random(secrets.randbits(64))
        recorded = {0} | set(rng.sample(range(1, n), k=min(2, n - 1)))
        echoed = recorded | set(rng.sample(range(n), k=min(2, n)))
        flusher = self._get_flusher()
        timer = self._get_timer()
        scratch = bytearray(0)
        inside, outside, eager, overhead = [], [], [], []
        expected_checks: list[list[torch.Tensor]] = []
        v.n_checked = 0
        for i, seed in enumerate(seeds):
            inputs = self._inputs(ref, seed, i)
            meta = pack(inputs, plane.view, 0, plane.in_size)
            sent = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs] if i in echoed else None
            # The reference runs here, through the same transport as the candidate's calls, so its
            # time is the eager baseline and its overhead calibrates the outside clock.
            flusher.flush()
            t_a = time.perf_counter()
            dev_inputs = unpack(meta, plane.view, 0, plane.in_size, dev)
            with torch.no_grad():
                timer.start()
                expected = _to_list(ref_model(*dev_inputs))
                eager_ms = timer.stop()
            need = nbytes_of(expected) + 4096
            if len(scratch) < need:
                scratch = bytearray(need)
            pack(expected, memoryview(scratch), 0, len(scratch))
            t_b = time.perf_counter()
            del dev_inputs
            if roles[i] == "check":
                expected_checks.append([e.detach().cpu() if isinstance(e, torch.Tensor) else e for e in expected])

            chan.send({"op": "prepare"})
            ready = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            if not ready.get("ok"):
                self._raise_reported(ready, v)
            cpu_before = _cpu_ns(proc.pid) if dev == "cpu" else None
            t_send = time.perf_counter()
            chan.send({"op": "call", "index": i, "inputs": meta, "record": i in recorded,
                       "echo_inputs": i in echoed})
            reply = self._recv(chan, proc, min(deadline, time.monotonic() + cfg.call_timeout_s), f"call {i}")
            t_recv = time.perf_counter()
            cpu_ms = None if cpu_before is None else (_cpu_ns(proc.pid) - cpu_before) / 1e6
            if not reply.get("ok"):
                self._raise_reported(reply, v)
            self._blocked(reply, v)
            try:
                got = unpack(reply.get("outputs"), plane.view, plane.out_offset, plane.out_size)
            except TransportError as exc:
                raise _Stop(FC.MISMATCH, f"call {i}: unusable output: {exc}") from None
            structure = reply.get("structure")
            want_structure = "tensor" if len(expected) == 1 and isinstance(expected[0], torch.Tensor) \
                and not isinstance(ref_model, type(None)) else None
            cmp = compare_outputs(expected, got, atol=cfg.atol, rtol=cfg.rtol, max_rel_l2=cfg.max_rel_l2)
            if cmp.ok and want_structure == "tensor" and structure != "tensor" and len(got) == 1:
                cmp = type(cmp)(False, f"output is a {structure}, expected a single tensor")
            v.max_abs_err = max(v.max_abs_err or 0.0, cmp.max_abs_err)
            v.max_rel_l2_err = max(v.max_rel_l2_err or 0.0, cmp.rel_l2_err)
            record = CallRecord(index=i, role=roles[i], inside_ms=_num(reply.get("inside_ms")),
                                outside_ms=(t_recv - t_send) * 1e3 if cpu_ms is None else cpu_ms / self._cores,
                                max_abs_err=cmp.max_abs_err,
                                rel_l2_err=cmp.rel_l2_err, ok=cmp.ok)
            v.calls.append(record)
            if not cmp.ok:
                phase = "checked" if roles[i] == "check" else roles[i]
                raise _Stop(FC.MISMATCH, f"call {i} ({phase}): {cmp.message}")
            v.n_checked += 1
            if sent is not None:
                self._check_echo(sent, reply, plane, i)
            if i in recorded:
                found = pol.check_dispatched(_strs(reply.get("ops")), cfg.policy)
                found += pol.check_kernels(_strs(reply.get("kernels")), cfg.policy)
                if found:
                    v.policy_violations.extend(found)
                    raise _Stop(FC.POLICY, found[0])
            changed = _strs(reply.get("flags_changed"))
            if changed:
                v.policy_violations.append(f"forward changed global numeric settings: {', '.join(changed)}")
                raise _Stop(FC.TAMPERING, v.policy_violations[-1])
            if roles[i] == "timed" and i not in recorded and record.inside_ms is not None:
                inside.append(record.inside_ms)
                outside.append(record.outside_ms)
                eager.append(eager_ms)
                # transport cost of the same call, measured here (on the CPU backend in CPU time)
                overhead.append(((t_b - t_a) * 1e3 - eager_ms) / (self._cores if dev == "cpu" else 1))
        v.correct = True
        v.task_warnings = degenerate_warnings(expected_checks, atol=cfg.atol, rtol=cfg.rtol)
        if len(inside) < 2:
            raise _Stop(FC.JUDGE, "too few timed calls to report a time")
        rtt = 0.0 if dev == "cpu" else self._round_trip_ms(
            {"op": "call", "index": 0, "inputs": meta, "record": False, "echo_inputs": False})
        rel_slack, abs_slack = cfg.slack()
        rec = reconcile(inside, outside, statistics.median(overhead) + rtt, rel_slack=rel_slack,
                        abs_slack_ms=abs_slack)
        v.runtime = rec.timing
        v.eager = summarize(eager)
        if rec.note:
            v.notes.append(rec.note)
        if rec.gross_lie:
            v.correct = False
            raise _Stop(FC.TIMING, rec.note)

    def _check_echo(self, sent: list, reply: dict, plane: DataPlane, i: int) -> None:
        try:
            back = unpack(reply.get("echo"), plane.view, 0, plane.in_size)
        except TransportError:
            raise _Stop(FC.MISMATCH, f"call {i}: the candidate process did not return its inputs") from None
        for k, (a, b) in enumerate(zip(sent, back)):
            if isinstance(a, torch.Tensor):
                if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype \
                        or not torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                                           b.reshape(-1).view(torch.uint8) if b.numel() else b):
                    raise _Stop(FC.MISMATCH, f"call {i}: forward modified input {k} in place")

    def _round_trip_ms(self, sample: dict) -> float:
        """Median request/reply time to a trusted process, for a message like `sample`."""
        if self._rtt_ms is None:
            import subprocess
            import sys

            a, b = socket.socketpair()
            proc = subprocess.Popen([sys.executable, "-I", "-m", "cuda_agent.judge.echo", str(b.fileno())],
                                    pass_fds=(b.fileno(),), stdin=subprocess.DEVNULL)
            b.close()
            chan = Channel(a)
            try:
                times = []
                for k in range(25):
                    t = time.perf_counter()
                    chan.send(sample)
                    chan.recv(timeout=30)
                    if k >= 5:
                        times.append((time.perf_counter() - t) * 1e3)
                    time.sleep(0.002)
                self._rtt_ms = statistics.median(times)
                chan.send({"op": "exit"})
            except (ChannelClosed, ChannelTimeout, OSError):
                self._rtt_ms = 0.0  # no calibration: the outside clock is then stricter, never looser
            finally:
                chan.close()
                try:
                    proc.wait(timeout=5)
                except Exception:
                    proc.kill()
        return self._rtt_ms

    def _pin(self, plane: DataPlane) -> None:
        """Page-lock the shared region so copies to and from the GPU run at full DMA speed."""
        if self.device != "cuda":
            return
        import ctypes

        ptr = ctypes.addressof(ctypes.c_char.from_buffer(plane.mm))
        if torch.cuda.cudart().cudaHostRegister(ptr, plane.size, 0) == 0:
            plane.pinned_ptr = ptr

    def _get_zygote(self) -> Zygote | None:
        if not self.config.use_zygote:
            return None
        if self._zygote is None or self._zygote.proc.poll() is not None:
            self._zygote = Zygote(env={"OMP_WAIT_POLICY": "PASSIVE"} if self.device == "cpu" else {})
        return self._zygote

    def _get_flusher(self) -> CacheFlusher:
        if self._flusher is None:
            self._flusher = CacheFlusher(self.device, self.config.flush_l2)
        return self._flusher

    def _get_timer(self) -> CallTimer:
        if self._timer is None:
            self._timer = CallTimer(self.device)
        return self._timer

    # -------------------------------------------------------------------------------- baselines
    def _compiled_baseline(self, task: Task, ref: _Reference, ref_model) -> Timing | None:
        cfg = self.config
        key = hashlib.sha256(json.dumps([task.id, self.device_name, torch.__version__, cfg.compile_mode,
                                         cfg.flush_l2, cfg.n_timed]).encode()).hexdigest()[:24]
        if key in self._compiled_timing:
            return self._compiled_timing[key]
        path = self.baseline_dir / f"{key}.json"
        if cfg.cache_baselines and path.exists():
            try:
                timing = Timing.model_validate_json(path.read_text())
                self._compiled_timing[key] = timing
                return timing
            except ValueError:
                path.unlink(missing_ok=True)
        compiled = torch.compile(ref_model, mode=cfg.compile_mode)
        flusher, timer = self._get_flusher(), self._get_timer()
        times = []
        dev = self.device
        for i in range(3 + cfg.n_timed):
            inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x
                      for x in self._inputs(ref, secrets.randbits(63), i)]
            flusher.flush()
            with torch.no_grad():
                timer.start()
                compiled(*inputs)
                ms = timer.stop()
            if i >= 3:
                times.append(ms)
        timing = summarize(times)
        self._compiled_timing[key] = timing
        if cfg.cache_baselines:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(timing.model_dump_json())
            os.replace(tmp, path)
        return timing


def _cpu_ns(pid: int) -> int:
    """CPU time (ns) the process's threads have run so far, from the kernel's scheduler statistics.

    On the CPU backend this is the outside clock: unlike wall time it does not grow while the
    process waits for a core on a loaded machine, and the candidate cannot change it. Divided by
    the number of cores it is a lower bound of the wall time the work needed.
    """
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0 else None


def _strs(x) -> list[str]:
    return [str(s)[:300] for s in x[:4096]] if isinstance(x, list) else []


def _log_excerpt(proc: Sandboxed) -> str:
    text = proc.log_tail(3000)
    lines = [ln for ln in text.splitlines() if "cuda_agent/judge" not in ln]
    return "\n".join(lines[-25:])


def judge(task: Task, candidate: Candidate, config: JudgeConfig | None = None) -> Verdict:
    """One-shot convenience wrapper around `Judge`."""
    with Judge(config) as j:
        return j.evaluate(task, candidate)

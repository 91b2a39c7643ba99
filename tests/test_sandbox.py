"""The sandbox of candidate processes, checked from inside real sandboxed processes.

What a candidate process must find (threat-model categories 14-16): a uid of its own even where the
interpreter lives under a folder other users cannot enter, the judge's memory and folders out of
reach, writes outside its workdir refused (libtorch's own file mapping included), and a CPU clock
in the judge that counts threads which have already exited. These tests need root for the uid and
the namespaces (as in CI); the parts that do not are run everywhere.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from cuda_agent.judge import sandbox as sb
from cuda_agent.judge.clocks import cpu_ns
from cuda_agent.reward import reward_of

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="uid drop and namespaces need a root judge")

BURN_IN_THREAD = textwrap.dedent("""
    import threading, time
    def burn():
        t = time.thread_time()
        while time.thread_time() - t < 0.4:
            pass
    th = threading.Thread(target=burn)
    th.start()
    th.join()                      # the thread has exited: no /proc/<pid>/task entry is left of it
    print("done", flush=True)
    time.sleep(30)
""")


@pytest.fixture
def uid():
    """A sandbox uid leased as a judge leases its own (None where the tests are not root): a
    judge of another test process never shares it, and so never loses a process to this test's
    clean-up by uid."""
    if os.geteuid() != 0:
        yield None
        return
    from cuda_agent import host

    with host.lease_uids(host.JUDGE_UIDS, [0], os.getpid()) as lease:
        yield lease.base


def _wait_for(path: Path, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in {path}: {path.read_text(errors='replace') if path.exists() else ''}")


def test_cpu_clock_counts_threads_that_have_exited(tmp_path):
    log = tmp_path / "out.txt"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-I", "-c", BURN_IN_THREAD], stdout=fh)
    try:
        _wait_for(log, "done")
        live_threads = sum(1 for _ in os.scandir(f"/proc/{proc.pid}/task"))
        assert live_threads == 1
        assert cpu_ns(proc.pid) >= 0.35e9
    finally:
        proc.kill()
        proc.wait()


@root_only
def test_cpu_clock_reads_a_process_of_another_uid(tmp_path, uid):
    workdir = sb.new_workdir(sb.work_root_dir() / "runs", "clock-")
    (workdir / "burn.py").write_text(BURN_IN_THREAD)
    proc = sb.Sandboxed(sb.SandboxSpec(argv=[sys.executable, "-I", str(workdir / "burn.py")], workdir=workdir,
                                       uid=uid))
    try:
        _wait_for(proc.log_path, "done")
        assert sb._proc_status(str(proc.pid)).get("Uid", "").split()[0] == str(uid)
        assert cpu_ns(proc.pid) >= 0.35e9
    finally:
        proc.cleanup()


INSIDE = textwrap.dedent("""
    import json, os, sys
    report = {"resuid": list(os.getresuid())}
    import torch
    import cuda_agent.judge.worker
    report["torch"] = torch.__version__
    pkg = os.path.dirname(os.path.realpath(cuda_agent.__file__))

    def attempt(name, fn):
        try:
            report[name] = ["ok", repr(fn())[:200]]
        except Exception as exc:
            report[name] = ["refused", type(exc).__name__]

    attempt("judge_mem", lambda: open(f"/proc/{JUDGE}/mem", "rb").read(1))
    attempt("list_cache", lambda: os.listdir(CACHE))
    attempt("read_cache_file", lambda: open(os.path.join(CACHE, "secret.txt")).read())
    attempt("list_work_root", lambda: sorted(os.listdir(WORK)))
    attempt("list_runs", lambda: sorted(os.listdir(os.path.join(WORK, "runs"))))
    attempt("other_run", lambda: os.listdir(OTHER))
    attempt("write_own", lambda: open("own.txt", "w").write("x"))
    attempt("write_package", lambda: open(os.path.join(pkg, "CANDIDATE_WAS_HERE_sandbox_test.txt"), "w"))
    attempt("from_file_package", lambda: torch.from_file(os.path.join(pkg, "CANDIDATE_WAS_HERE_ff.bin"), True, 8))
    attempt("storage_from_file_package",
            lambda: torch.UntypedStorage.from_file(os.path.join(pkg, "CANDIDATE_WAS_HERE_us.bin"), True, 8))
    attempt("from_file_own", lambda: torch.from_file(os.path.abspath("own.bin"), True, 8).sum().item())
    print("REPORT " + json.dumps(report), flush=True)
""")


@root_only
def test_sandboxed_process_has_its_own_uid_and_sees_none_of_the_judge(tmp_path, uid):
    import cuda_agent

    work = sb.work_root_dir()
    # beside the work root, where every user can reach it: only the mount hides it
    cache = Path(sb.new_workdir(work.parent, "test-cache-"))
    (cache / "secret.txt").write_text("baseline")
    os.chmod(cache, 0o755)
    os.chmod(cache / "secret.txt", 0o644)
    other = sb.new_workdir(work / "runs", "other-")
    os.chmod(other, 0o755)
    workdir = sb.new_workdir(work / "runs", "probe-")
    code = INSIDE.replace("JUDGE", str(os.getpid())).replace("CACHE", repr(str(cache))) \
        .replace("WORK", repr(str(work))).replace("OTHER", repr(str(other)))
    (workdir / "probe.py").write_text(code)
    proc = sb.Sandboxed(sb.SandboxSpec(argv=[sys.executable, "-I", str(workdir / "probe.py")], workdir=workdir,
                                       uid=uid, hide=(cache,)))
    try:
        proc.proc.wait(timeout=120)
        log = proc.log_tail(20000)
    finally:
        proc.cleanup()
        sb._remove(other)
        sb._remove(cache)
    lines = [ln for ln in log.splitlines() if ln.startswith("REPORT ")]
    assert lines, log
    r = json.loads(lines[-1][len("REPORT "):])
    assert r["resuid"] == [uid] * 3
    assert r["torch"]
    assert r["judge_mem"][0] == "refused"
    assert r["list_cache"] == ["ok", "[]"]  # an empty tmpfs over the cache
    assert r["read_cache_file"][0] == "refused"
    # only the path to its own workdir (the precompiled headers are the builds', in the cache folder)
    assert r["list_work_root"][0] == "ok" and set(ast.literal_eval(r["list_work_root"][1])) <= {"runs"}
    assert r["list_runs"] == ["ok", repr([workdir.name])]
    assert r["other_run"][0] == "refused"
    assert r["write_own"][0] == "ok"
    assert r["from_file_own"][0] == "ok"
    for key in ("write_package", "from_file_package", "storage_from_file_package"):
        assert r[key][0] == "refused", (key, r[key])
    pkg = Path(cuda_agent.__file__).resolve().parent
    assert not list(pkg.glob("CANDIDATE_WAS_HERE*"))


@root_only
def test_runtime_under_a_private_home_is_exposed_read_only():
    """Where the interpreter lives under a folder others cannot enter (/root here and in CI), the
    plan covers that folder and binds only the runtime paths back."""
    view = sb.private_view(sb.work_root_dir(), (), drop_uid=True)
    hidden_prefix = [p for p in sb.runtime_paths() if sb._barrier(p) is not None]
    for p in hidden_prefix:
        assert p in view["expose"]
        assert sb._barrier(p) in view["barriers"]
    for b in view["barriers"]:
        assert not os.stat(b).st_mode & 0o001


def test_a_builds_precompiled_headers_are_shown_from_the_cache_it_is_given(tmp_path):
    """The precompiled headers live in the judge's cache folder, which a sandboxed process does not
    see: a build is given their folder (SandboxSpec.expose, whatever the cache folder is) and gets
    it back read-only, in its mount plan and its Landlock plan; a process not given it does not."""
    cache = tmp_path / "cache"
    pch = cache / "pch"
    pch.mkdir(parents=True)
    workdir = sb.new_workdir(sb.work_root_dir() / "runs", "pch-view-")
    try:
        for drop_uid in (False, True):
            view = sb.private_view(workdir, (cache,), drop_uid, expose=(pch,))
            assert os.path.realpath(pch) in view["expose"]
            assert os.path.realpath(pch) not in sb.private_view(workdir, (cache,), drop_uid)["expose"]
        plan = sb.landlock_plan(workdir, (cache,), (pch,))
        assert os.path.realpath(cache) in plan["hide"] and os.path.realpath(pch) in plan["expose"]
    finally:
        sb._remove(workdir)


def test_missing_isolation_is_named_before_candidate_code_runs():
    """What a worker checks in itself before loading candidate code: this test process has no
    seccomp filter, and its uid and network are the ones it is told must differ."""
    missing = sb.missing_in_self({"uid": os.getuid() + 1, "netns": sb._netns(os.getpid())})
    text = "; ".join(missing)
    assert "uid drop" in text and "network namespace" in text and "seccomp" in text


@root_only
def test_isolation_gaps_are_read_from_the_kernel(tmp_path, uid):
    """A process without the network namespace it was required to have, and without seccomp, is
    reported as incomplete; the same process checked against what it was given is complete on
    uid and network."""
    workdir = sb.new_workdir(sb.work_root_dir() / "runs", "gaps-")
    (workdir / "wait.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(30)\n")
    proc = sb.Sandboxed(sb.SandboxSpec(argv=[sys.executable, "-I", str(workdir / "wait.py")], workdir=workdir,
                                       uid=uid, isolate_network=False))
    try:
        _wait_for(proc.log_path, "up")
        missing, reduced = proc.isolation_gaps(audit_hook=True)
        assert reduced == []
        assert len(missing) == 1 and "seccomp" in missing[0]  # a plain script installs none
        proc.spec.isolate_network = True  # now judged against a requirement it was not given
        missing, _ = proc.isolation_gaps(audit_hook=False)
        text = "; ".join(missing)
        assert "network namespace" in text and "audit hook" in text and "uid" not in text
    finally:
        proc.cleanup()


def _tanh_task_and_candidate():
    from cuda_agent.candidate import Candidate
    from cuda_agent.tasks import Task

    task = Task.from_source("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                            "    def forward(self, x):\n        return torch.tanh(x)\n\n"
                            "def get_inputs():\n    return [torch.randn(256)]\n\n"
                            "def get_init_inputs():\n    return []\n", name="sandbox_tanh")
    return task, Candidate.from_source(task.source.replace("class Model(", "class ModelNew("))


def _config(tmp_path, **kw):
    from cuda_agent.judge import JudgeConfig

    return JudgeConfig(device="cpu", policy="lenient", compile_mode="none", n_timed=3, n_warmup=0, n_check=2,
                       cache_dir=tmp_path, **kw)


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "fresh-interpreter"])
def test_verdict_reports_the_isolation_in_force(tmp_path, zygote):
    from cuda_agent.judge import Judge

    task, cand = _tanh_task_and_candidate()
    with Judge(_config(tmp_path, use_zygote=zygote, spares=0)) as judge:
        v = judge.evaluate(task, cand)
    assert v.correct, v.failure
    assert "seccomp" in v.isolation
    if os.geteuid() == 0:
        assert v.reduced_isolation == []
        assert any(x.startswith("uid ") for x in v.isolation)
        assert "no network" in v.isolation and "private mounts" in v.isolation
    else:
        assert any("separate uid" in x for x in v.reduced_isolation)
    assert v.summary()["reduced_isolation"] == v.reduced_isolation


def test_incomplete_isolation_fails_the_verdict_as_the_judges_fault(tmp_path, monkeypatch):
    """The judge reads seccomp from the kernel's record; where that record says none (simulated
    here by the reader, the candidate process itself is real), the verdict fails as `judge`."""
    from cuda_agent.judge import FailureCategory, Judge

    task, cand = _tanh_task_and_candidate()
    monkeypatch.setattr(sb.process, "seccomp_mode", lambda pid: 0)  # where the judge's process reads it
    with Judge(_config(tmp_path, spares=0)) as judge:
        v = judge.evaluate(task, cand)
    assert not v.correct and reward_of(v).value == -1
    assert v.failure is not None and v.failure.category == FailureCategory.JUDGE
    assert "seccomp" in v.failure.message and "isolation" in v.failure.message


@pytest.mark.gpu
def test_cuda_spare_worker_runs_under_its_own_uid_with_the_gpu_plane(tmp_path):
    """The CUDA path: spare workers (fresh interpreters) under their own uid and mount namespace
    still reach the GPU, map the judge's GPU region (CUDA IPC across uids) and judge correctly."""
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import Task

    task = Task.from_source("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                            "    def forward(self, x):\n        return torch.tanh(x)\n\n"
                            "def get_inputs():\n    return [torch.randn(1 << 20)]\n\n"
                            "def get_init_inputs():\n    return []\n", name="sandbox_tanh_cuda")
    cand = Candidate.from_source(task.source.replace("class Model(", "class ModelNew("))
    cfg = JudgeConfig(device="cuda", policy="lenient", compile_mode="none", n_timed=3, n_warmup=0, n_check=2,
                      cache_dir=tmp_path, spares=1)
    with Judge(cfg) as judge:
        v = judge.evaluate(task, cand)
    assert v.correct, v.failure
    assert "seccomp" in v.isolation
    if os.geteuid() == 0:
        assert v.reduced_isolation == []
        assert any(x.startswith("uid ") for x in v.isolation) and "private mounts" in v.isolation
    assert not any("GPU sharing unavailable" in n for n in v.notes), v.notes


HOG = textwrap.dedent("""
    import time
    blocks = []
    for _ in range(8):                # 8 x 64 MiB, every page written
        blocks.append(bytearray(64 << 20))
    time.sleep(60)
""")


def test_the_memory_watchdog_stops_a_process_over_its_limit_while_the_judge_waits(tmp_path):
    """Session.recv, waiting for an answer that never comes, fails the run as `oom` once the
    process's resident memory passes the limit: the host's own OOM killer is never the judge's
    watchdog (the fault fixture that allocates 1 GiB blocks can time out first on a host whose
    memory is slow to reclaim)."""
    from cuda_agent import host
    from cuda_agent.judge.evaluation import Stop
    from cuda_agent.judge.protocol import ChannelTimeout
    from cuda_agent.judge.session import Session
    from cuda_agent.judge.verdict import FailureCategory

    class Silent:  # a channel on which the worker never answers
        def recv(self, timeout: float):
            time.sleep(timeout)
            raise ChannelTimeout("nothing yet")

    spec = sb.SandboxSpec(argv=[sys.executable, "-I", "-c", HOG], workdir=tmp_path / "hog",
                          uid=host.JUDGE_UIDS.start + 998 if os.geteuid() == 0 else None)
    proc = sb.Sandboxed(spec)
    try:
        session = Session(proc, Silent(), plane=None, memory_limit_mb=256, disk_limit_mb=4096)
        t0 = time.monotonic()
        with pytest.raises(Stop) as stop:
            session.recv(time.monotonic() + 50, "call 0")
        assert stop.value.failure.category is FailureCategory.OOM, stop.value
        assert "exceeded 256 MiB of host memory during call 0" in stop.value.failure.message
        assert time.monotonic() - t0 < 45  # the watchdog, not the deadline
    finally:
        proc.kill()
        proc.cleanup()


# ---------------------------------------------------------------------------------------------
# Landlock: what keeps a candidate of the judge's own uid (a judge that is not root) out of the
# judge's files and every file outside its workdir, C and libtorch's own file access included.

needs_landlock = pytest.mark.skipif(sb.landlock_abi() < 1, reason="this kernel offers no Landlock")

CONFINED = textwrap.dedent("""
    import json, os, sys
    from cuda_agent.judge import sandbox as sb
    sb.install_landlock(json.loads(sys.argv[1]))
    report = {}
    import torch
    report["torch"] = torch.__version__
    os.chdir(WORKDIR)

    def attempt(name, fn):
        try:
            report[name] = ["ok", repr(fn())[:200]]
        except Exception as exc:
            report[name] = ["refused", type(exc).__name__]

    attempt("read_cache_file", lambda: open(os.path.join(CACHE, "secret.txt")).read())
    attempt("list_work_root", lambda: os.listdir(WORK))
    attempt("other_run", lambda: os.listdir(OTHER))
    attempt("write_own", lambda: open("own.txt", "w").write("x"))
    attempt("from_file_own", lambda: torch.from_file(os.path.abspath("own.bin"), True, 8).sum().item())
    attempt("write_tmp", lambda: open(os.path.join(TMP, "py.txt"), "w"))
    # libtorch's own file mapping: opened in C++, not seen by the audit hook
    attempt("from_file_tmp", lambda: torch.from_file(os.path.join(TMP, "ff.bin"), True, 8))
    attempt("from_file_cache", lambda: torch.from_file(os.path.join(CACHE, "secret.txt"), False, 8,
                                                       dtype=torch.uint8).tolist())
    attempt("write_dev_null", lambda: open("/dev/null", "w").write("x"))
    attempt("write_dev_shm", lambda: open("/dev/shm/cuda-agent-landlock-test-" + str(os.getpid()), "w"))
    report["confined"] = sb.landlock_confined(WORKDIR)
    print("REPORT " + json.dumps(report), flush=True)
""")


@needs_landlock
def test_landlock_keeps_a_process_of_the_judges_uid_out_of_its_files(tmp_path):
    """No uid drop and no private mounts here (the judge's uid, as when it is not root; root's
    capabilities do not pass Landlock either): the kernel alone refuses what lies outside."""
    work = sb.work_root_dir()
    cache = Path(sb.new_workdir(work.parent, "test-cache-"))
    (cache / "secret.txt").write_text("baseline")
    other = sb.new_workdir(work / "runs", "other-")
    workdir = sb.new_workdir(work / "runs", "landlock-")
    outside = Path(sb.new_workdir(Path(tempfile.gettempdir()), "landlock-outside-"))
    code = CONFINED.replace("CACHE", repr(str(cache))).replace("WORKDIR", repr(str(workdir))) \
        .replace("WORK", repr(str(work))).replace("OTHER", repr(str(other))).replace("TMP", repr(str(outside)))
    plan = sb.landlock_plan(workdir, (cache,))
    try:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(plan)], capture_output=True, text=True,
                             timeout=180, cwd=workdir)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")]
        assert lines, out.stdout + out.stderr
        r = json.loads(lines[-1][len("REPORT "):])
        assert r["torch"]
        for key in ("write_own", "from_file_own", "write_dev_null"):
            assert r[key][0] == "ok", (key, r[key])
        for key in ("read_cache_file", "list_work_root", "other_run", "write_tmp", "from_file_tmp",
                    "from_file_cache", "write_dev_shm"):
            assert r[key][0] == "refused", (key, r[key])
        assert r["confined"] is True
        assert not list(outside.iterdir())
    finally:
        for d in (cache, other, workdir, outside):
            sb._remove(Path(d))


@needs_landlock
def test_a_judge_asked_for_landlock_runs_its_candidates_under_it(tmp_path):
    from cuda_agent.judge import Judge

    task, cand = _tanh_task_and_candidate()
    with Judge(_config(tmp_path, landlock="on", spares=0)) as judge:
        v = judge.evaluate(task, cand)
    assert v.correct, v.failure
    assert "landlock" in v.isolation and "seccomp" in v.isolation


@needs_landlock
def test_a_process_that_asked_for_landlock_and_can_still_read_the_work_root_is_incomplete(uid):
    workdir = sb.new_workdir(sb.work_root_dir() / "runs", "ll-gaps-")
    (workdir / "wait.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(30)\n")
    proc = sb.Sandboxed(sb.SandboxSpec(argv=[sys.executable, "-I", str(workdir / "wait.py")], workdir=workdir,
                                       uid=uid, landlock="on"))
    try:
        _wait_for(proc.log_path, "up")
        assert "landlock" in proc.isolation
        missing, _ = proc.isolation_gaps(audit_hook=True, confined=False)
        assert any("Landlock" in m for m in missing)
        missing, _ = proc.isolation_gaps(audit_hook=True, confined=True)
        assert not any("Landlock" in m for m in missing)
    finally:
        proc.cleanup()


def test_landlock_mode_is_checked():
    with pytest.raises(ValueError):
        sb.landlock_use("maybe")
    assert sb.landlock_use("off") is False
    assert sb.landlock_use("auto") is (os.geteuid() != 0 and sb.landlock_abi() >= 1)
    # "auto" leaves CUDA judges without it until the GPU tier has run it; asked for, they get it
    from cuda_agent.judge import JudgeConfig

    assert JudgeConfig(device="cuda").landlock_mode() == "off"
    assert JudgeConfig(device="cpu").landlock_mode() == "auto"
    assert JudgeConfig(device="cuda", landlock="on").landlock_mode() == "on"


@root_only
def test_a_cgroup_still_being_torn_down_at_exit_is_removed_before_the_process_ends():
    """The reaper that removes a killed process's cgroup once the kernel has let go of it is a
    daemon thread, which dies with the process: a judge that exits meanwhile left the cgroup behind
    for good. Here the cgroup cannot go until a child cgroup in it (the stand-in for a slow
    teardown) is removed, half a second later, just as the process ends."""
    script = textwrap.dedent("""
        import os, sys, threading
        from cuda_agent.judge.sandbox.cgroups import _kill_cgroup, _pids_cgroup
        path = _pids_cgroup(8)
        if path is None:
            print("none"); sys.exit(0)
        os.mkdir(os.path.join(path, "held"))
        _kill_cgroup(path)             # cannot be removed yet: the reaper starts
        threading.Timer(0.5, os.rmdir, [os.path.join(path, "held")]).start()
        print(path, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip()
    if path == "none":
        pytest.skip("no pids cgroup can be made here")
    assert not os.path.exists(path), f"{path} was left behind"


def test_the_cgroup_reaper_keeps_trying_past_a_slow_teardown(monkeypatch):
    """A killed process's cgroup can only go once the kernel has torn the process down; on a
    loaded machine that took longer than the reaper once waited (ten seconds), and the cgroup
    stayed until the judge exited. Here removal succeeds only at the 300th try."""
    from cuda_agent.judge.sandbox import cgroups

    tries = []
    monkeypatch.setattr(cgroups, "_removed", lambda path: tries.append(path) or len(tries) >= 300)
    monkeypatch.setattr(cgroups.time, "sleep", lambda s: None)
    path = "/sys/fs/cgroup/pids/cuda-agent-test-slow"
    with cgroups._unreaped_lock:
        cgroups._unreaped.add(path)
    cgroups._reap_cgroup(path)
    assert len(tries) == 300 and path not in cgroups._unreaped
    # and past its limit it leaves the cgroup to the exit hook, not forgotten
    tries.clear()
    monkeypatch.setattr(cgroups, "_removed", lambda path: tries.append(path) and False)
    with cgroups._unreaped_lock:
        cgroups._unreaped.add(path)
    cgroups._reap_cgroup(path, limit_s=0.0)
    assert path in cgroups._unreaped
    with cgroups._unreaped_lock:
        cgroups._unreaped.discard(path)


def _wait_gone(path: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(path)


@root_only
def test_a_sandboxed_process_takes_its_cgroup_with_it_however_it_ends(uid):
    """The pids cgroup of a sandboxed process goes when its start fails (here: the zygote that
    was to fork it refuses), and when the object is dropped without a clean-up: a leftover one
    stays until reboot, and the kernel's count of cgroups is finite."""
    import gc

    class RefusingZygote:
        def usable(self):
            return True

        def spawn(self, *args):
            raise OSError("the zygote is gone")

    made = []
    real = sb.process._pids_cgroup

    def recording(max_procs):
        made.append(real(max_procs))
        return made[-1]

    workdir = sb.new_workdir(sb.work_root_dir() / "runs", "cg-")
    spec = sb.SandboxSpec(argv=[sys.executable, "-I", "-c", "pass"], workdir=workdir, uid=uid,
                          target="worker", target_args=[])
    sb.process._pids_cgroup = recording
    try:
        with pytest.raises(OSError, match="zygote is gone"):
            sb.Sandboxed(spec, RefusingZygote())
        proc = sb.Sandboxed(sb.SandboxSpec(argv=[sys.executable, "-I", "-c", "pass"], workdir=workdir, uid=uid))
        proc.proc.wait(timeout=60)
    finally:
        sb.process._pids_cgroup = real
    if made[0] is None:
        pytest.skip("no pids cgroup can be made here")
    assert _wait_gone(made[0]), "a failed start left its cgroup"
    assert os.path.isdir(made[1])
    del proc
    gc.collect()
    assert _wait_gone(made[1]), "a sandboxed process dropped without clean-up left its cgroup"
    sb._remove(workdir)


@root_only
def test_cgroups_of_judges_that_were_killed_are_swept_when_the_next_judge_starts():
    from cuda_agent.judge.sandbox import cgroups

    base = next((b for b in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup") if os.path.exists(os.path.join(b, "cgroup.procs"))),
                None)
    probe = cgroups._pids_cgroup(8) if base is not None else None
    if probe is None:
        pytest.skip("no pids cgroup can be made here")
    os.rmdir(probe)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)   # a process id that is free again (if nothing took it since)
    old = time.monotonic_ns() - int(120e9)
    stale = os.path.join(base, f"cuda-agent-{dead}-{old}")
    recent = os.path.join(base, f"cuda-agent-{dead}-{time.monotonic_ns()}")
    alive = os.path.join(base, f"cuda-agent-{os.getpid()}-{old}")
    for path in (stale, recent, alive):
        os.mkdir(path)
    try:
        cgroups._sweep_stale(base)
        if os.path.exists(f"/proc/{dead}"):
            pytest.skip("the dead process's id was taken again")
        assert not os.path.exists(stale)
        assert os.path.isdir(recent) and os.path.isdir(alive)   # too new, or its maker lives
    finally:
        for path in (stale, recent, alive):
            if os.path.isdir(path):
                os.rmdir(path)

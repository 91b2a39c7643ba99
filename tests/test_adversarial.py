"""Adversarial fixtures against the judge.

Every fixture under tests/fixtures/{cpu,cuda}/{honest,hacks,faults}/ is a candidate (a single .py
file defining ModelNew, or a workspace folder with model_new.py) whose header says what must happen:

    # task: <path under tests/fixtures/tasks/>
    # expect: pass | fail
    # category: <honest, fallback, tampering, answer, phase, replay, timer, inputs, mutation,
    #            precision, degenerate, stochastic, resource, fault>
    # why: <one line>
    # failure: <FailureCategory values allowed when it fails, comma-separated>   (optional)
    # policy: lenient                                                             (optional)

Honest fixtures must be judged correct with reward >= 1 and no violations; every other fixture must
get reward -1 with a failure or a policy violation. Besides the verdict, each run is checked for
side effects that must never happen: new files in the judge's package or in its build tree,
processes of the sandbox left running, a TCP connection reaching this machine's loopback.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from conftest import build_ahead_in_parallel, judge_cache_dir, read_header, selected_params
from cuda_agent.candidate import Candidate
from cuda_agent.judge import FailureCategory, Judge, JudgeConfig
from cuda_agent.tasks import load_task_file
from cuda_agent.reward import reward_of

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
GROUPS = ("honest", "hacks", "faults")
CATEGORIES = {"honest", "fallback", "tampering", "answer", "phase", "replay", "timer", "inputs", "mutation",
              "precision", "degenerate", "stochastic", "resource", "fault"}
NET_PORT = 47613          # resource_network_connect fixtures try to reach this port
MARKER = "CANDIDATE_WAS_HERE"


# ------------------------------------------------------------------------------------ discovery
def discover(device: str) -> list[Path]:
    found = []
    for group in GROUPS:
        folder = FIXTURES / device / group
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "model_new.py").is_file():
                found.append(path)
            elif path.is_file() and path.suffix == ".py":
                found.append(path)
    return found


def fixture_id(path: Path) -> str:
    return path.relative_to(FIXTURES).as_posix()


CPU_FIXTURES = discover("cpu")
CUDA_FIXTURES = discover("cuda")


# ------------------------------------------------------------------------------------ judges
def make_config(device: str, cache_dir: Path, policy: str = "strict") -> JudgeConfig:
    # Short call limit so hang fixtures cost seconds; on the CPU a 4 GiB memory limit keeps the
    # allocation fixtures far from what a small CI machine has (a CUDA process needs more).
    if device == "cpu":
        limits = {"call_timeout_s": 10.0, "memory_limit_mb": 4096}
    else:
        limits = {"call_timeout_s": 20.0}
    return JudgeConfig(device=device, compile_mode="none", n_timed=5, cache_dir=cache_dir, policy=policy,
                       **limits)


def build_ahead_of_the_judge(device: str, policy: str, paths: list[Path], cache_dir: Path) -> None:
    """The fixtures of one (device, policy) compiled into the judge's cache ahead, as many at once as
    there are cores (conftest.build_ahead_in_parallel)."""
    mine = [p for p in paths if read_header(p).get("policy", "strict") == policy]
    build_ahead_in_parallel(mine, make_config(device, cache_dir, policy))


@pytest.fixture(scope="module")
def judges(tmp_path_factory, request):
    """One Judge per (device, policy) for the whole module; builds are shared through one cache,
    filled ahead with the CPU fixtures this session will judge (`build_ahead_of_the_judge`)."""
    cache_dir = judge_cache_dir(tmp_path_factory)
    created: dict[tuple[str, str], Judge] = {}
    ahead = {"cpu": selected_params(request.session, __file__, "test_cpu_fixture", "path")}

    def get(device: str, policy: str = "strict") -> Judge:
        key = (device, policy)
        if key not in created:
            build_ahead_of_the_judge(device, policy, ahead.get(device, []), cache_dir)
            created[key] = Judge(make_config(device, cache_dir, policy))
            LIVE_JUDGES.append(created[key])
        return created[key]

    yield get
    for j in created.values():
        LIVE_JUDGES.remove(j)
        j.close()


# Every judge of this test process: their spare workers are expected, wherever a check looks.
LIVE_JUDGES: list[Judge] = []


class Listener:
    """A TCP server on 127.0.0.1:NET_PORT that records every connection it accepts."""

    def __init__(self):
        self.connections: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", NET_PORT))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    self.connections.append(conn.recv(256))
                except OSError:
                    self.connections.append(b"")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="module")
def listener():
    try:
        server = Listener()
    except OSError:
        yield None  # port taken: the network check is skipped, the verdict checks still run
        return
    yield server
    server.close()


# ------------------------------------------------------------------------------------ side effects
def _judge_package_files() -> set[str]:
    """Files of the installed package; in __pycache__ only files named like the fixtures' markers
    (the interpreter itself may add bytecode there)."""
    import cuda_agent

    root = Path(cuda_agent.__file__).resolve().parent
    return {str(p) for p in root.rglob("*")
            if p.is_file() and ("__pycache__" not in p.parts or MARKER in p.name)}


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if line.split()[1] == str(uid):
                            pids.append(int(name))
                        break
        except OSError:
            pass
    return pids


def _pids_in_own_cgroups() -> list[int]:
    """Processes still inside a pids cgroup that a judge in this process created (when it makes one)."""
    tag = f"cuda-agent-{os.getpid()}-"
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cgroup") as fh:
                if tag in fh.read():
                    pids.append(int(name))
        except OSError:
            pass
    return pids


def _who(pid: int) -> str:
    """A leftover process as /proc tells it (command line, uid, parent, cgroup): what to chase."""
    def read(name: str) -> str:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    status = dict(line.split(":", 1) for line in read("status").splitlines() if ":" in line)
    cmd = read("cmdline").replace("\0", " ").strip()[:200]
    return (f"{pid} uid={(status.get('Uid') or '?').split()[0]} "
            f"ppid={status.get('PPid', '?').strip()} state={status.get('State', '?').strip()} "
            f"cgroup={read('cgroup').strip()[-80:]} cmd={cmd!r}")


def side_effects(j: Judge, package_before: set[str], listener: Listener | None, seen_connections: int) -> list[str]:
    """What the candidate left behind; cleans it up so later tests start clean."""
    problems = []
    for extra in sorted(_judge_package_files() - package_before):
        problems.append(f"new file in the judge's package: {extra}")
        Path(extra).unlink(missing_ok=True)
    build_root = getattr(getattr(j, "builder", None), "build_root", None)
    if build_root is not None and Path(build_root).is_dir():
        for marker in Path(build_root).rglob(f"{MARKER}*"):
            problems.append(f"the candidate wrote into the judge's build tree: {marker}")
            marker.unlink(missing_ok=True)
    # The judge's spare workers wait between evaluations by design (they run no candidate code
    # until a task reaches them); anything else under a sandbox uid or cgroup is a leftover.
    standby = set().union(*(x.standby_pids() for x in LIVE_JUDGES), j.standby_pids())
    for uid in sorted(j.sandbox_uids()):
        left = [p for p in _uid_pids(uid) if p not in standby]
        if left:
            problems.append(f"{len(left)} process(es) of the sandbox uid {uid} still running: {left[:10]}")
    left = [p for p in _pids_in_own_cgroups() if p not in standby]
    if left:
        problems.append(f"{len(left)} process(es) still in this judge's sandbox cgroups: "
                        f"{[_who(p) for p in left[:10]]}")
    if listener is not None and len(listener.connections) > seen_connections:
        problems.append(f"the candidate reached 127.0.0.1:{NET_PORT}: {listener.connections[seen_connections:]}")
    return problems


# ------------------------------------------------------------------------------------ checks
def describe(path: Path, verdict) -> str:
    failure = f"{verdict.failure.category.value}: {verdict.failure.message[:600]}" if verdict.failure else None
    return (f"{fixture_id(path)}: reward={reward_of(verdict).value} correct={verdict.correct} failure={failure} "
            f"violations={verdict.policy_violations[:3]} runtime_ms={verdict.runtime_ms} "
            f"eager_ms={verdict.eager_ms} notes={verdict.notes[:3]}")


def check_verdict(path: Path, header: dict[str, str], verdict) -> None:
    text = describe(path, verdict)
    if header["expect"] == "pass":
        assert verdict.failure is None, text
        assert verdict.correct is True, text
        assert not verdict.policy_violations, text
        assert reward_of(verdict).value >= 1, text
        return
    assert reward_of(verdict).value == -1, text
    assert verdict.correct is False, text
    assert verdict.failure is not None or verdict.policy_violations, text
    allowed = {s.strip() for s in header.get("failure", "").split(",") if s.strip()}
    if allowed:
        got = verdict.failure.category.value if verdict.failure is not None else "policy"
        assert got in allowed, f"failure category {got!r} not in {sorted(allowed)}; {text}"


def run_fixture(path: Path, device: str, judges, listener) -> None:
    header = read_header(path)
    task = load_task_file(TASKS / header["task"])
    candidate = Candidate.from_path(path)
    j = judges(device, header.get("policy", "strict"))
    package_before = _judge_package_files()
    seen = len(listener.connections) if listener is not None else 0
    verdict = j.evaluate(task, candidate)
    problems = side_effects(j, package_before, listener, seen)
    print(describe(path, verdict))  # shown with -rP: which defence stopped each hack
    check_verdict(path, header, verdict)
    assert not problems, f"{fixture_id(path)}: " + "; ".join(problems)


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("path", CPU_FIXTURES + CUDA_FIXTURES, ids=fixture_id)
def test_fixture_header(path: Path) -> None:
    header = read_header(path)
    for key in ("task", "expect", "category", "why"):
        assert header.get(key), f"{fixture_id(path)}: header lacks '# {key}:'"
    assert (TASKS / header["task"]).is_file(), f"{fixture_id(path)}: no task {header['task']}"
    assert header["expect"] in {"pass", "fail"}
    assert header["category"] in CATEGORIES, header["category"]
    assert (header["expect"] == "pass") == (header["category"] == "honest")
    assert header.get("policy", "strict") in {"strict", "lenient"}
    valid = {c.value for c in FailureCategory}
    for value in filter(None, (s.strip() for s in header.get("failure", "").split(","))):
        assert value in valid, f"{fixture_id(path)}: unknown failure category {value!r}"
    is_cuda_task = header["task"].startswith("cuda/")
    assert is_cuda_task == (path.relative_to(FIXTURES).parts[0] == "cuda"), "CPU fixtures use CPU-sized tasks"


def test_every_threat_category_has_fixtures() -> None:
    for device, fixtures in (("cpu", CPU_FIXTURES), ("cuda", CUDA_FIXTURES)):
        categories = {read_header(p)["category"] for p in fixtures}
        missing = CATEGORIES - categories
        assert not missing, f"{device}: no fixture for {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("path", CPU_FIXTURES, ids=fixture_id)
def test_cpu_fixture(path: Path, judges, listener) -> None:
    run_fixture(path, "cpu", judges, listener)


def _cuda_params(paths: list[Path]) -> list:
    # a fixture that spins on the GPU until killed takes the GPU alone (conftest._gpu_lock)
    return [pytest.param(p, marks=pytest.mark.gpu_exclusive) if read_header(p).get("failure") == "timeout" else p
            for p in paths]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", _cuda_params(CUDA_FIXTURES), ids=fixture_id)
def test_cuda_fixture(path: Path, judges, listener) -> None:
    run_fixture(path, "cuda", judges, listener)


def _survival(device: str, judges, listener, faults: list[str], honest: str) -> None:
    j = judges(device, "strict")
    honest_path = FIXTURES / device / "honest" / honest
    for name in faults:
        fault_path = FIXTURES / device / "faults" / name
        header = read_header(fault_path)
        verdict = j.evaluate(load_task_file(TASKS / header["task"]), Candidate.from_path(fault_path))
        check_verdict(fault_path, header, verdict)
        after = j.evaluate(load_task_file(TASKS / read_header(honest_path)["task"]), Candidate.from_path(honest_path))
        check_verdict(honest_path, read_header(honest_path), after)
    assert not side_effects(j, _judge_package_files(), listener, len(listener.connections) if listener else 0)


@pytest.mark.slow
def test_cpu_judge_survives_faults(judges, listener) -> None:
    """The same Judge object keeps judging correctly after crashes, aborts, hangs and memory blow-ups."""
    _survival("cpu", judges, listener,
              ["fault_segfault.py", "fault_abort.py", "fault_oob_write.py", "fault_huge_alloc.py",
               "fault_kernel_infinite_loop.py"], "matmul_omp.py")


@pytest.mark.gpu
@pytest.mark.gpu_exclusive  # its hang fixture spins on the GPU
@pytest.mark.slow
def test_cuda_judge_survives_faults(judges, listener) -> None:
    _survival("cuda", judges, listener,
              ["fault_illegal_address.py", "fault_segfault.py", "fault_kernel_infinite_loop.py"], "matmul_tiled.py")

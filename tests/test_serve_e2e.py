"""`cuda-agent serve` end to end on the CPU backend: the real judge builds and judges C++ candidates
for clients over loopback; the service process is killed with SIGKILL while it judges and started
again, and the clients get every verdict, each stored once. (Slow tier: it compiles C++.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import httpx  # noqa: E402

from cuda_agent.candidate import Candidate  # noqa: E402
from cuda_agent.serve.client import ClientConfig, JudgeClient  # noqa: E402
from cuda_agent.suite import suite_solutions, suite_tasks  # noqa: E402

TOKEN = "e2e-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(tmp_path: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, CUDA_AGENT_SERVE_TOKEN=TOKEN)
    log = open(tmp_path / f"serve-{time.monotonic_ns()}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "cuda_agent.cli", "serve", "--port", str(port), "--device", "cpu",
         "--compile-mode", "none", "--workers", "1", "--compile-workers", "0", "--db", str(tmp_path / "results.sqlite"),
         "-c", "n_timed=5", "-c", f"cache_dir=\"{tmp_path / 'cache'}\""],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_service(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the service exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/v1/health", timeout=2).json()["status"] == "ok":
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError("the service did not become healthy")


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/v1/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.split()[0] == name)


def test_serve_judges_cpp_candidates_and_survives_a_kill(tmp_path):
    tasks = {t.name: t for t in suite_tasks("cpu")}
    solutions = suite_solutions("cpu")
    names = ["2_GELU", "5_Sum_Rows"]
    work = [(tasks[n], Candidate.from_path(solutions[n])) for n in names]
    broken = (tasks["2_GELU"], Candidate.from_source(
        work[0][1].model_new.replace("#include <cmath>", "#include <cmath>\n#error deliberately broken"),
        origin="broken"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_service(tmp_path, port)
    try:
        wait_healthy(url, proc)
        client = JudgeClient(url, TOKEN, run="e2e", config=ClientConfig(retries=200, backoff_s=0.2, max_backoff_s=2,
                                                                      poll_wait_s=5))
        futures = [client.submit(t, c) for t, c in work] + [client.submit(*broken)]
        duplicate = client.submit(*work[0])
        assert duplicate is futures[0], "the same candidate twice is one submission"
        # Kill the service once its first verdict is committed, while the others are in flight (its
        # workers die with it), then start it again.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and metric(url, "cuda_agent_serve_verdicts_total") < 1:
            time.sleep(0.2)
        assert metric(url, "cuda_agent_serve_verdicts_total") == 1
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc = start_service(tmp_path, port)
        verdicts = [f.result(timeout=900) for f in futures]
        assert metric(url, "cuda_agent_serve_requeued_at_start_total") == 2, "two were in flight"
        assert metric(url, "cuda_agent_serve_verdicts_total") == 2, "the finished one was not judged again"
        client.shutdown()
    finally:
        stop_service(proc)
    gelu, sum_rows, bad = verdicts
    assert gelu.correct and sum_rows.correct, (gelu.summary(), sum_rows.summary())
    assert not bad.compiled and bad.failure.category.value == "compile", bad.failure.message
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        rows = conn.execute("SELECT task_name, candidate_hash FROM verdicts WHERE run='e2e'").fetchall()
        states = conn.execute("SELECT state, COUNT(*) FROM service_jobs GROUP BY state").fetchall()
    assert sorted(rows) == sorted((t.name, c.hash) for t, c in work + [broken]), "each pair once"
    assert states == [("done", 3)]


def test_solve_judges_through_the_service(tmp_path):
    """`cuda-agent solve --judge-url`: a scripted model writes a bundled solution; compile, verify and
    submit are judged by the service (this process runs no judge), the broken first attempt gets the
    compiler's message back through it, and a judge setting given beside --judge-url is refused."""
    sys.path.insert(0, str(Path(__file__).parent))
    from agent_server import ScriptedModel, last_observation, tool, tools

    def expect(*needles, then):
        def step(request):
            seen = last_observation(request)
            for needle in needles:
                assert needle in seen, f"expected {needle!r} in:\n{seen}"
            return then
        return step

    root = Path(suite_solutions("cpu")["10_RMSNorm"])
    files = {"model_new.py": (root / "model_new.py").read_text()}
    files |= {f"kernels/{p.name}": p.read_text() for p in sorted((root / "kernels").iterdir())}
    broken = files["kernels/rmsnorm.cpp"].replace("(float)eps;", "(float)epsilon;")
    assert broken != files["kernels/rmsnorm.cpp"]
    script = [
        tools(*[("write_file", {"path": p, "content": broken if p == "kernels/rmsnorm.cpp" else t})
                for p, t in files.items()]),
        tool("compile"),
        expect("compile: FAILED", "epsilon", "judged by the service", then=tool(
            "write_file", path="kernels/rmsnorm.cpp", content=files["kernels/rmsnorm.cpp"])),
        tool("verify"),
        expect("verify: PASSED", then=tool("profile")),
        expect("profile (judge's timing): PASSED", then=tool("submit")),
    ]
    task_file = next(p for p in suite_tasks("cpu") if p.name == "10_RMSNorm").origin
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_service(tmp_path, port)
    try:
        wait_healthy(url, proc)
        with ScriptedModel(script) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CUDA_AGENT"))}
            env |= {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key", "CUDA_AGENT_SERVE_TOKEN": TOKEN}
            cmd = [sys.executable, "-m", "cuda_agent.cli", "solve", str(task_file), "--out", str(tmp_path / "out"),
                   "--judge-url", url, "--max-turns", str(len(script) + 2)]
            refused = subprocess.run(cmd + ["--device", "cpu"], capture_output=True, text=True, env=env, timeout=120)
            assert refused.returncode == 2 and "leave out --device" in refused.stderr, refused.stderr
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            assert res.returncode == 0, res.stderr[-4000:]
            assert not server.errors, server.errors
        summary = json.loads((tmp_path / "out" / "result.json").read_text())
        assert summary["termination"] == "submitted", summary
        assert summary["best"] and summary["best"]["reward"] >= 1
        assert metric(url, "cuda_agent_serve_verdicts_total") == 2, "broken and fixed; verify, profile, submit: one"
    finally:
        stop_service(proc)

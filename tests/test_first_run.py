"""What a new user meets first: exit codes that mean the same in every command, a dead model server or
a missing GPU reported in seconds with one clear line, the reason of an agent's error on the terminal,
and a live view of a run's progress. Nothing here builds C++ or reaches the judge's workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_server import RELU_TASK, ScriptedModel, http_error, say, tool
from rich.console import Console

from cuda_agent.agent import Agent, AgentConfig, AgentProgress, ChatClient, ModelConfig, Reset, StepResult, Trajectory
from cuda_agent.agent.live import LiveView
from cuda_agent.agent.tools import tool_specs
from cuda_agent.reward import Reward
from cuda_agent.candidate import Candidate
from cuda_agent.judge.verdict import Timing, Verdict
from cuda_agent.llm import ProviderError
from cuda_agent.tasks import Task

TASK = RELU_TASK


def cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CUDA_AGENT_MODEL"))}
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env=base | (env or {}), timeout=timeout)


class Result:
    def __init__(self, code: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = code, stdout, " ".join(stderr.split())


def invoke(args: list[str], env: dict | None = None) -> Result:
    """The CLI in this process (typer's runner): for checks that end before any work, without the
    seconds a fresh interpreter spends importing torch. stderr comes back with its line breaks
    (rich wraps at 80 columns off a terminal) folded into spaces."""
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    clear = {k: None for k in os.environ if k.startswith(("OPENAI", "CUDA_AGENT_MODEL"))}
    res = CliRunner().invoke(app, args, env=clear | (env or {}))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return Result(res.exit_code, res.stdout, res.stderr)


def dead_url() -> str:
    """A loopback address nothing listens on (a server started and stopped)."""
    with ScriptedModel() as server:
        url = server.url
    return url


def no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.fixture
def module(tmp_path) -> Path:
    path = tmp_path / "my_module.py"
    path.write_text(TASK)
    return path


# ------------------------------------------------------------------------------------------ the model server
def test_check_reports_a_dead_server_at_once():
    client = ChatClient(ModelConfig(base_url=dead_url(), api_key="k", model="m", max_retries=5))
    t0 = time.monotonic()
    with pytest.raises(ProviderError, match="cannot connect .*(refused|Errno).*is it running"):
        client.check()
    assert time.monotonic() - t0 < 5  # one attempt, none of the retry schedule


def test_check_names_the_model_and_what_is_wrong():
    with ScriptedModel() as server:
        assert ChatClient(ModelConfig(base_url=server.url, api_key="k")).check() == "scripted-model"
        assert ChatClient(ModelConfig(base_url=server.url, api_key="k", model="scripted-model")).check() \
            == "scripted-model"
        with pytest.raises(ProviderError, match="does not serve 'other'.*lists: scripted-model"):
            ChatClient(ModelConfig(base_url=server.url, api_key="k", model="other")).check()
        assert server.model_lists == 3 and not server.requests  # no chat request is spent on a check


def test_solve_against_a_dead_server_fails_in_seconds_with_one_line(module, tmp_path):
    t0 = time.monotonic()
    res = cli(["solve", str(module), "--out", str(tmp_path / "out"), "--device", "cpu"],
              {"OPENAI_BASE_URL": dead_url(), "CUDA_AGENT_MODEL": "m"})
    seconds = time.monotonic() - t0
    assert res.returncode == 3, res.stderr
    assert "cannot connect" in res.stderr and "is it running" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()  # no workspace made, no turn spent
    assert seconds < 60, seconds  # the import of torch included; the check itself takes a fraction of a second


def test_run_checks_the_server_once_and_exits_3_when_every_task_errors(module, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_a.py").write_text(TASK)
    (tasks / "2_b.py").write_text(TASK.replace("torch.relu(x)", "torch.relu(x) * 2"))
    res = cli(["run", str(tasks), "--out", str(tmp_path / "dead"), "--device", "cpu"],
              {"OPENAI_BASE_URL": dead_url(), "CUDA_AGENT_MODEL": "m"})
    assert res.returncode == 3 and "cannot connect" in res.stderr and not (tmp_path / "dead").exists()

    with ScriptedModel(default=http_error(401, "invalid api key [for] this project")) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k"}
        res = cli(["run", str(tasks), "--out", str(tmp_path / "run"), "--device", "cpu"], env)
        assert server.model_lists == 1
    assert res.returncode == 3, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert out.count("invalid api key [for] this project") == 2  # each task's reason, not read as markup
    assert "every task ended in an error (2 of 2)" in " ".join(res.stderr.split())


def test_a_finished_task_needs_no_server(module, tmp_path):
    with ScriptedModel(default=tool("list_files")) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k"}
        res = cli(["solve", str(module), "--out", str(tmp_path / "out"), "--device", "cpu", "--max-turns", "1"], env)
        assert res.returncode == 0, res.stderr
    res = invoke(["solve", str(module), "--out", str(tmp_path / "out"), "--device", "cpu"],
                 {"OPENAI_BASE_URL": dead_url()})
    assert res.returncode == 0 and "finished earlier" in res.stdout


# ------------------------------------------------------------------------------------------ devices and exit codes
@pytest.mark.skipif(not no_cuda(), reason="needs a machine without CUDA")
def test_solve_and_bench_on_cuda_without_a_gpu_fail_before_any_work(module, tmp_path):
    with ScriptedModel(default=tool("list_files")) as server:
        res = invoke(["solve", str(module), "--out", str(tmp_path / "out"), "--device", "cuda"],
                     {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k"})
        assert not server.requests and not server.model_lists
    assert res.returncode == 3 and "CUDA is not available (use --device cpu)" in res.stderr
    assert not (tmp_path / "out").exists()
    db = tmp_path / "results.sqlite"
    res = invoke(["bench", "--device", "cuda", "--db", str(db)])
    assert res.returncode == 3 and "CUDA is not available" in res.stderr and not db.exists()


def test_usage_errors_exit_2_in_every_command(module, tmp_path):
    missing = str(tmp_path / "nope.py")
    for args in (["eval", "--task", missing, "--solution", str(module)],
                 ["eval", "--task", str(module), "--solution", missing],
                 ["solve", missing, "--base-url", "http://127.0.0.1:9/v1"],
                 ["run", missing, "--base-url", "http://127.0.0.1:9/v1", "--device", "cpu"],
                 ["bench", missing, "--device", "cpu"],
                 ["bench", str(module), "--device", "cpu", "--db", str(tmp_path / "db.sqlite")],  # no --solutions
                 ["bench", str(module), "--device", "cpu", "--workers", "0"],
                 ["synth", "--n", "1", "--out", str(module)]):
        res = invoke(args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
    assert not (tmp_path / "db.sqlite").exists()  # no empty run left behind
    assert "nope.py: no such" in invoke(["eval", "--task", missing, "--solution", str(module)]).stderr
    assert "--solutions is required" in invoke(["bench", str(module), "--device", "cpu"]).stderr
    res = invoke(["bench", str(module), "--device", "cpu", "--workers", "0"])
    assert "judge_workers" in res.stderr and "--workers" in res.stderr
    assert "names a folder" in invoke(["synth", "--n", "1", "--out", str(module)]).stderr


def test_a_file_that_is_not_a_task_exits_3_in_solve_as_in_eval(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_inputs():\n    return []\n")
    res = invoke(["solve", str(broken), "--base-url", "http://127.0.0.1:9/v1"])
    assert res.returncode == 3 and "broken.py" in res.stderr and "Model" in res.stderr


def test_bench_with_no_matching_solution_creates_no_run(module, tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "other_task.py").write_text("class ModelNew: pass\n")
    db = tmp_path / "results.sqlite"
    res = invoke(["bench", str(module), "--solutions", str(solutions), "--device", "cpu", "--db", str(db)])
    assert res.returncode == 2 and "no solution matches" in res.stderr
    assert not db.exists()


def test_version_and_flags_in_help():
    res = cli(["--version"])
    assert res.returncode == 0 and res.stdout.startswith("cuda-agent ")
    res = invoke(["eval", "--help"])
    json_row = next(line for line in res.stdout.splitlines() if "--json" in line)
    assert "<bool>" not in json_row  # a flag takes no value; `--json true` is refused


# ------------------------------------------------------------------------------------------ the live view
def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5)


class VerifyEnv:
    """An environment whose `verify` returns a correct verdict 1.6x faster than eager, once."""

    def __init__(self, task: Task):
        self.task = task

    def reset(self) -> Reset:
        return Reset(task=self.task, device="cpu", tools=tool_specs())

    def step(self, call) -> StepResult:
        if call.name != "verify":
            return StepResult(observation="ok")
        cand = Candidate.from_files("class ModelNew: pass\n", {"k.cpp": "// k\n"})
        v = Verdict(task_id=self.task.id, task_name=self.task.name, candidate_hash=cand.hash, device="cpu",
                    compiled=True, correct=True, runtime=timing(1.0), eager=timing(1.6))
        return StepResult(observation="verify: correct", verdict=v, candidate=cand,
                          reward=Reward(value=2.0, reason="scored"))

    def close(self) -> None:
        pass


def test_the_loop_reports_progress_after_each_reply_and_tool(tmp_path):
    task = Task.from_source(TASK, name="relu")
    seen: list[AgentProgress] = []
    script = [tool("list_files"), tool("verify"), say("thinking aloud"), tool("read_file", path="model.py")]
    with ScriptedModel(script) as server:
        client = ChatClient(ModelConfig(base_url=server.url, api_key="k", model="scripted-model"))
        Agent(client, VerifyEnv(task), AgentConfig(max_turns=4), Trajectory(), on_progress=seen.append).run()
    assert [(p.event, p.turn, p.tool) for p in seen] == [
        ("model", 1, None), ("tool", 1, "list_files"), ("model", 2, None), ("tool", 2, "verify"),
        ("model", 3, None), ("model", 4, None), ("tool", 4, "read_file")]
    assert seen[0].best is None and seen[3].verdict.correct and seen[3].best_turn == 2
    assert seen[-1].best.speedup_vs_eager == pytest.approx(1.6) and seen[-1].max_turns == 4
    assert seen[4].tool_calls == 0  # the reply that called no tool
    tokens = [p.prompt_tokens for p in seen if p.event == "model"]
    assert tokens == sorted(tokens) and tokens[0] > 0 and seen[-1].completion_tokens > 0


def test_a_failing_view_does_not_end_the_run(tmp_path):
    task = Task.from_source(TASK, name="relu")

    def broken(_: AgentProgress) -> None:
        raise BrokenPipeError("terminal closed")

    trajectory = Trajectory()
    with ScriptedModel(default=tool("list_files")) as server:
        client = ChatClient(ModelConfig(base_url=server.url, api_key="k", model="scripted-model"))
        result = Agent(client, VerifyEnv(task), AgentConfig(max_turns=3), trajectory, on_progress=broken).run()
    assert result.termination.value == "max_turns" and result.turns == 3
    assert [e["text"] for e in trajectory.events if e["type"] == "note"] == [
        "progress view dropped: BrokenPipeError: terminal closed"]


def progress(**fields) -> AgentProgress:
    base = dict(event="tool", task_name="my_module", turn=3, max_turns=150, seconds=75.0, prompt_tokens=12_345,
                completion_tokens=678, context_tokens=9_000, context_budget=128_000)
    return AgentProgress(**(base | fields))


def test_the_live_view_shows_turn_tool_verdict_best_and_tokens():
    task = Task.from_source(TASK, name="relu")
    step = VerifyEnv(task).step(type("Call", (), {"name": "verify"})())
    v, r = step.verdict, step.reward
    console = Console(record=True, width=140, force_terminal=True, color_system=None)
    with LiveView(console, live=True) as view:
        view.update(progress(tool="write_file", ok=True))
        view.update(progress(tool="verify", ok=True, verdict=v, reward=r, best=v, best_reward=r, best_turn=3))
    text = console.export_text()
    for needle in ("my_module", "turn 3/150", "1m15s", "12.3k in", "verify", "correct", "1.60x vs eager",
                   "best: reward 2", "(turn 3)", "context 9.0k/128.0k"):
        assert needle in text, (needle, text)


def test_without_a_terminal_the_view_writes_one_line_per_tool_call():
    console = Console(record=True, width=200, force_terminal=False, color_system=None)
    with LiveView(console) as view:
        assert not view.live
        view.update(progress(event="model", tool_calls=1))                 # a reply with a call: no line
        view.update(progress(tool="compile", ok=False))
        view.update(progress(event="model", tool_calls=0, turn=4))         # a reply that called no tool
        # no torch.compile baseline was timed (--compile-mode none): the best is told vs eager
        step = VerifyEnv(Task.from_source(TASK, name="relu")).step(type("Call", (), {"name": "verify"})())
        v, r = step.verdict, step.reward
        view.update(progress(tool="verify", ok=True, verdict=v, reward=r, best=v, best_reward=r, best_turn=5, turn=5))
    lines = console.export_text().splitlines()
    assert lines == ["turn 3/150 compile: failed | no correct candidate yet | tokens 13.0k",
                     "turn 4/150 model: the reply called no tool | no correct candidate yet | tokens 13.0k",
                     "turn 5/150 verify: correct, reward 2, 1.60x vs eager, - vs torch.compile | best 1.60x vs eager"
                     " | tokens 13.0k"]


def test_solve_shows_its_progress_and_the_final_line(module, tmp_path):
    with ScriptedModel([tool("list_files"), tool("read_file", path="model.py")]) as server:
        res = cli(["solve", str(module), "--out", str(tmp_path / "out"), "--device", "cpu", "--max-turns", "2"],
                  {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k"})
    assert res.returncode == 0, res.stderr
    assert "turn 1/2 list_files: ok" in res.stderr and "turn 2/2 read_file: ok" in res.stderr
    assert "my_module: max_turns after 2 turns" in res.stdout
    assert json.loads((tmp_path / "out" / "result.json").read_text())["turns"] == 2


def test_a_resumed_run_names_the_other_torch_builds_it_holds(tmp_path):
    import torch

    from cuda_agent.bench import _other_torch_builds
    from cuda_agent.db import ResultsDB

    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r", spec="suite:cpu", device="cpu", settings_digest="d", info={})
        for name, version in (("1_a", "2.11.0+cu130"), ("2_b", torch.__version__)):
            task = Task.from_source(TASK + f"# {name}\n", name=name)
            cand = Candidate.from_files(f"class ModelNew: pass\n# {name}\n", {})
            db.add_verdict("r", task, cand, Verdict(task_id=task.id, task_name=name, candidate_hash=cand.hash,
                                                    device="cpu", versions={"torch": version}), reward=-1.0)
        assert _other_torch_builds(db, "r") == ["2.11.0+cu130"]


def test_the_check_can_be_turned_off_for_a_server_with_an_incomplete_list(module, tmp_path):
    with ScriptedModel(default=tool("list_files")) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k", "CUDA_AGENT_MODEL": "alias"}
        res = invoke(["solve", str(module), "--out", str(tmp_path / "a"), "--device", "cpu", "--max-turns", "1"], env)
        assert res.returncode == 3 and "does not serve 'alias'" in res.stderr and not server.requests
        res = invoke(["solve", str(module), "--out", str(tmp_path / "b"), "--device", "cpu", "--max-turns", "1",
                      "-c", "model.check=false"], env)
        assert res.returncode == 0, res.stderr
        assert server.model_lists == 1 and [r["model"] for r in server.requests] == ["alias"]


# ------------------------------------------------------------------------------------------ install-torch.sh
INSTALL = Path(__file__).resolve().parents[1] / "install-torch.sh"

# A stand-in for the Python the script installs into: torch is not importable, `pip show` reports
# the build just installed, every pip command is recorded with the extra-index setting it saw, `pip
# config get` answers $FAKE_INDEX, and with $FAKE_UNREACHABLE PyTorch's index cannot be used.
FAKE_PYTHON = """#!/bin/bash
if [[ "$1" == "-" ]]; then exit 1; fi
if [[ "$1 $2 $3" == "-m pip show" ]]; then echo "Name: torch"; echo "Version: 2.13.0+cpu"; exit 0; fi
if [[ "$1 $2 $3 $4" == "-m pip config get" ]]; then [[ -n "$FAKE_INDEX" ]] && echo "$FAKE_INDEX"; exit 0; fi
if [[ "$1 $2" == "-m pip" ]]; then echo "pip ${*:3} | extra=[${PIP_EXTRA_INDEX_URL-unset}]" >> "$LOG";
  [[ -n "$FAKE_UNREACHABLE" && "$*" == *download.pytorch.org* ]] && exit 1; exit 0; fi
echo "install-torch: torch 2.13.0+cpu CUDA none (CPU build)"
"""


def run_install(tmp_path: Path, gpu: bool, **env) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    # nvidia-smi first on PATH, ahead of the machine's own: it lists a GPU, or fails as without a driver
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if gpu else
                   "#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n")
    smi.chmod(0o755)
    log = tmp_path / "pip.log"
    log.unlink(missing_ok=True)
    path = f"{bin_dir}:/usr/bin:/bin"
    res = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=60,
                         env={"PATH": path, "PYTHON": str(python), "LOG": str(log), **env})
    assert res.returncode == 0, res.stderr
    return log.read_text().splitlines()


def test_install_torch_takes_the_cpu_build_without_a_gpu(tmp_path):
    calls = run_install(tmp_path, gpu=False)
    assert calls[0] == ("pip install --no-deps --retries 0 --timeout 20 torch>=2.4,<2.15 --index-url "
                        "https://download.pytorch.org/whl/cpu | extra=[ ]")  # no configured extra index may offer PyPI's CUDA build
    assert calls[1] == "pip install torch==2.13.0+cpu | extra=[unset]"  # its dependencies, the build kept
    assert len(calls) == 2


def test_install_torch_honours_pips_configured_index_and_an_unreachable_pytorch_index(tmp_path):
    # an index the user configured is asked first, as for every other package
    assert run_install(tmp_path, gpu=False, FAKE_INDEX="https://mirror.example/simple") == [
        "pip install torch>=2.4,<2.15 | extra=[unset]"]
    # PyTorch's CPU index tried once; where it cannot be used, pip's configured sources
    calls = run_install(tmp_path, gpu=False, FAKE_UNREACHABLE="1")
    assert calls[0].startswith("pip install --no-deps --retries 0") and "download.pytorch.org" in calls[0]
    assert calls[1] == "pip install --no-deps torch>=2.4,<2.15 | extra=[unset]"
    assert calls[2] == "pip install torch==2.13.0+cpu | extra=[unset]"


def test_install_torch_takes_the_cuda_build_with_a_gpu_or_the_index_asked_for(tmp_path):
    assert run_install(tmp_path, gpu=True) == ["pip install torch>=2.4,<2.15 | extra=[unset]"]
    url = "https://download.pytorch.org/whl/cu128"
    assert run_install(tmp_path, gpu=False, CUDA_AGENT_TORCH_INDEX=url) == [
        f"pip install torch>=2.4,<2.15 --index-url {url} | extra=[unset]"]


class ListServer:
    """A loopback server that answers every GET (the model list) with one HTTP status."""

    def __init__(self, status: int):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps({"error": {"message": f"status {status}"}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> "ListServer":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_server_without_a_model_list_passes_the_check_when_the_model_is_named():
    with ListServer(404) as server:
        assert ChatClient(ModelConfig(base_url=server.url, api_key="k", model="m")).check() == "m"
        with pytest.raises(ProviderError, match="answered 404 to its model list.*name the model"):
            ChatClient(ModelConfig(base_url=server.url, api_key="k")).check()


def test_a_refused_key_is_named_by_the_check():
    with ListServer(401) as server:
        with pytest.raises(ProviderError, match="refused the API key .*401.*OPENAI_API_KEY"):
            ChatClient(ModelConfig(base_url=server.url, api_key="wrong", model="m")).check()

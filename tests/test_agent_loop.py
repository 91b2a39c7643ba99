"""The agent loop against a scripted model served over loopback HTTP (the real `openai` client).

None of these runs reaches the judge; `test_agent_e2e.py` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_server import ScriptedModel, http_error, last_observation, raw_tool, say, tool, tools

from cuda_agent.agent import (Agent, AgentConfig, ChatClient, LocalEvaluator, ModelConfig, ReplayClient, Termination,
                              Toolbox, ToolConfig, Trajectory, create_workspace, load_trajectory)
from cuda_agent.llm import render_native
from cuda_agent.agent.trajectory import conversation
from cuda_agent.judge import JudgeConfig
from cuda_agent.tasks import Task

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(1 << 14)]


def get_init_inputs():
    return [2.0]
'''


@pytest.fixture
def task() -> Task:
    return Task.from_source(TASK, name="relu_scale")


def make_agent(server: ScriptedModel, root: Path, task: Task, **agent) -> Agent:
    client = ChatClient(ModelConfig(base_url=server.url, api_key="test-key", max_retries=3, retry_base_s=0.01))
    config = AgentConfig(**agent)
    workspace = create_workspace(task, root / "ws", "cpu")
    # the judge behind the gate is created on first use; these scripts never call it
    box = Toolbox(task, workspace, LocalEvaluator(JudgeConfig(device="cpu")), config.tools)
    return Agent(client, box, config, Trajectory(root / "trajectory.jsonl"))


def tool_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "tool"]


def test_malformed_tool_calls_become_observations(task, tmp_path):
    script = [
        raw_tool("write_file", '{"path": "kernels/a.cpp", "content": "unterminated'),
        tool("no_such_tool", path="x"),
        raw_tool("read_file", '["model.py"]'),
        tool("read_file"),
        say('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "model.py"</tool_call>'),
        say("I am done, the kernel looks right to me."),
        tool("list_files"),
    ]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=len(script)).run()
    assert not server.errors, server.errors
    assert result.termination is Termination.MAX_TURNS and result.turns == len(script)
    assert result.best is None
    seen = [last_observation(r) for r in server.requests[1:]]
    assert "arguments are not valid JSON" in seen[0]
    assert "unknown tool 'no_such_tool'" in seen[1] and "write_file" in seen[1]
    assert "must be a JSON object" in seen[2]
    assert "bad arguments for read_file" in seen[3] and "path" in seen[3]
    assert "not valid JSON" in seen[4]
    no_call = server.requests[-1]["messages"][-1]  # the answer to the reply without a call
    assert no_call["role"] == "user" and "called no tool" in no_call["content"]
    # the history sent back holds only valid JSON arguments (servers re-parse them)
    for msg in server.requests[-1]["messages"]:
        for call in msg.get("tool_calls") or []:
            json.loads(call["function"]["arguments"])
    assert not (tmp_path / "ws" / "kernels" / "a.cpp").exists()


def test_read_only_files_cannot_be_edited(task, tmp_path):
    script = [
        tool("edit_file", path="model.py", old_text="torch.relu(x)", new_text="x"),
        lambda req: ("read-only" in last_observation(req) or pytest.fail("edit not refused"))
        and tool("write_file", path="binding.cpp", content="// replaced"),
        lambda req: ("read-only" in last_observation(req) or pytest.fail("write not refused"))
        and tool("run_shell", command="cat model.py | head -3"),
    ]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=3).run()
    assert not server.errors, server.errors
    assert result.termination is Termination.MAX_TURNS
    assert (tmp_path / "ws" / "model.py").read_text() == TASK
    assert "// replaced" not in (tmp_path / "ws" / "binding.cpp").read_text()
    events = tool_events(result_events(tmp_path))
    assert [e["ok"] for e in events] == [False, False, True]


def result_events(root: Path) -> list[dict]:
    return load_trajectory(root / "trajectory.jsonl")


def test_a_model_that_repeats_itself_is_warned_then_stopped(task, tmp_path):
    with ScriptedModel(default=tool("list_files", path="kernels")) as server:
        result = make_agent(server, tmp_path, task, max_turns=50, repeat_warn=3, repeat_limit=5).run()
    assert not server.errors
    assert result.termination is Termination.REPEATED and result.turns == 5
    warned = [i for i, r in enumerate(server.requests) if "same results 3 times in a row" in last_observation(r)]
    assert warned and warned[0] == 3  # the request after the 3rd identical step carries the warning


def test_max_turns_ends_the_run(task, tmp_path):
    script = [tool("read_file", path="model.py", start_line=i, end_line=i + 1) for i in (1, 3, 5)]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=3).run()
    assert not server.errors
    assert result.termination is Termination.MAX_TURNS and result.turns == 3 and len(server.requests) == 3
    end = result_events(tmp_path)[-1]
    assert end["type"] == "end" and end["termination"] == "max_turns" and end["turns"] == 3
    assert result.prompt_tokens > 0 and result.completion_tokens > 0


def test_context_compression_keeps_the_run_going(task, tmp_path):
    big = "\n".join(f"// filler line {i} " + "x" * 60 for i in range(100))  # ~8 kB per write and read
    script = []
    for i in range(4):
        script.append(tool("write_file", path=f"kernels/f{i}.cpp", content=big))
        script.append(tool("read_file", path=f"kernels/f{i}.cpp"))
    with ScriptedModel(script) as server:
        agent = make_agent(server, tmp_path, task, max_turns=len(script), context_tokens=30_000, reply_tokens=500,
                           compress_at=0.5, keep_recent=2)
        result = agent.run()
    assert not server.errors
    assert result.termination is Termination.MAX_TURNS
    edits = [e for e in result_events(tmp_path) if e["type"] == "edit" and e["reason"] == "compress"]
    assert edits, "the context was never compressed"
    last = server.requests[-1]["messages"]
    old_results = [m for m in last if m["role"] == "tool"][:-2]
    assert old_results and all(m["content"].startswith("[compressed]") or len(m["content"]) <= 300
                               for m in old_results)
    old_writes = [json.loads(c["function"]["arguments"]) for m in last[:-4] for c in m.get("tool_calls") or []
                  if c["function"]["name"] == "write_file"]
    assert old_writes and all(w["content"].startswith("[compressed]") for w in old_writes)
    # the newest results are whole, and the system prompt and task are untouched
    assert [m for m in last if m["role"] == "tool"][-2]["content"].count("filler line") == 100
    assert last[0] == server.requests[0]["messages"][0] and last[1] == server.requests[0]["messages"][1]
    assert len(json.dumps(last)) < len(json.dumps(server.requests[0]["messages"])) + 8 * 9000


def test_context_exhausted_when_nothing_is_left_to_compress(task, tmp_path):
    big = "y" * 9000
    script = [tool("write_file", path="kernels/big.txt", content=big)] + \
             [tool("read_file", path="kernels/big.txt", start_line=1, end_line=n) for n in range(1, 20)]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=20, context_tokens=5000, reply_tokens=500,
                            keep_recent=1, tools=ToolConfig(observation_chars=9500)).run()
    assert not server.errors
    # one whole observation no longer fits beside the system prompt and the task
    assert result.termination is Termination.CONTEXT_EXHAUSTED and result.turns <= 3
    assert "tokens of context in use" in result.message


def test_server_refusing_the_context_ends_the_run(task, tmp_path):
    script = [http_error(400, "This model's maximum context length is 4096 tokens. However, you requested 9000")]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=5).run()
    assert result.termination is Termination.CONTEXT_EXHAUSTED and "maximum context length" in result.message


def test_text_tool_calls_when_the_server_has_no_tool_calling(task, tmp_path):
    def first(req):
        assert "tools" not in req
        assert "<tools>" in req["messages"][0]["content"] and '"name": "write_file"' in req["messages"][0]["content"]
        return say('I will write a file.\n<tool_call>\n{"name": "write_file", "arguments": '
                   '{"path": "kernels/x.cpp", "content": "int x = 1;\\n"}}\n</tool_call>')

    def second(req):
        obs = req["messages"][-1]
        assert obs["role"] == "user" and '<tool_response name="write_file">' in obs["content"]
        assert "wrote" in obs["content"]
        return say('<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>\n'
                   '<tool_call>\n{"name": "read_file", "arguments": {"path": "kernels/x.cpp"}}\n</tool_call>')

    def third(req):
        obs = req["messages"][-1]["content"]  # both results in one user message
        assert "kernels/x.cpp" in obs and "1| int x = 1;" in obs and obs.count("<tool_response") == 2
        return say("<tool_call>\n{\"name\": \"list_files\", \"arguments\": {}}\n</tool_call>")

    with ScriptedModel([first, second, third], reject_tools=True) as server:
        agent = make_agent(server, tmp_path, task, max_turns=3)
        result = agent.run()
    assert not server.errors, server.errors
    assert result.termination is Termination.MAX_TURNS
    assert (tmp_path / "ws" / "kernels" / "x.cpp").read_text() == "int x = 1;\n"
    assert agent.client.text_mode
    assert len(server.requests) == 4  # the refused native request, then three in text mode


def test_transient_server_errors_are_retried(task, tmp_path):
    script = [http_error(503, "overloaded"), http_error(500, "oops"), tool("list_files")]
    with ScriptedModel(script) as server:
        result = make_agent(server, tmp_path, task, max_turns=1).run()
    assert result.termination is Termination.MAX_TURNS
    model = [e for e in result_events(tmp_path) if e["type"] == "model"]
    assert model[0]["attempts"] == 3


def test_a_refusing_server_ends_the_run_with_an_error(task, tmp_path):
    with ScriptedModel([http_error(401, "invalid api key")]) as server:
        result = make_agent(server, tmp_path, task, max_turns=5).run()
    assert result.termination is Termination.ERROR and "invalid api key" in result.message
    assert len(server.requests) == 1  # not retried


def test_a_trajectory_replays(task, tmp_path):
    script = [
        tools(("write_file", {"path": "kernels/k.cpp", "content": "int k;\n"}), ("list_files", {})),
        raw_tool("read_file", "{oops"),
        tool("edit_file", path="kernels/k.cpp", old_text="int k;", new_text="int k = 2;"),
        tool("run_shell", command="cat kernels/k.cpp"),
    ]
    with ScriptedModel(script) as server:
        first = make_agent(server, tmp_path / "a", task, max_turns=len(script))
        first.run()
    events = load_trajectory(tmp_path / "a" / "trajectory.jsonl")
    assert conversation(events) == first.messages
    for turn in (1, 2, 3):  # what the model was sent at each turn
        assert render_native(conversation(events, turn=turn)) == server.requests[turn - 1]["messages"]

    config = AgentConfig(max_turns=len(script))
    workspace = create_workspace(task, tmp_path / "b" / "ws", "cpu")
    box = Toolbox(task, workspace, LocalEvaluator(JudgeConfig(device="cpu")), config.tools)
    replayed = Agent(ReplayClient(events), box, config)
    result = replayed.run()
    assert result.termination is Termination.MAX_TURNS
    original = [(e["name"], e["observation"].replace(str(tmp_path / "a"), "")) for e in tool_events(events)]
    again = [(e["name"], e["observation"].replace(str(tmp_path / "b"), ""))
             for e in tool_events(replayed.trajectory.events)]
    assert again == original
    assert (workspace / "kernels" / "k.cpp").read_text() == "int k = 2;\n"


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_solve_without_a_model_server_is_a_usage_error(tmp_path):
    (tmp_path / "task.py").write_text(TASK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CUDA_AGENT_MODEL"))}
    res = _cli(["solve", str(tmp_path / "task.py"), "--out", str(tmp_path / "out"), "--device", "cpu"], env)
    assert res.returncode == 2 and "--base-url" in res.stderr
    assert not (tmp_path / "out").exists()


def test_solve_and_run_commands_are_resumable(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "1_relu.py").write_text(TASK)
    (tasks / "2_relu_sq.py").write_text(TASK.replace("torch.relu(x) * self.scale", "torch.relu(x) * x"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    with ScriptedModel(default=tool("list_files")) as server:
        env |= {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key"}
        res = _cli(["solve", str(tasks / "1_relu.py"), "--out", str(tmp_path / "solve"), "--max-turns", "2",
                    "--device", "cpu"], env)
        assert res.returncode == 0, res.stderr
        summary = json.loads((tmp_path / "solve" / "result.json").read_text())
        assert summary["termination"] == "max_turns" and summary["turns"] == 2 and summary["best"] is None
        assert (tmp_path / "solve" / "workspace" / "model_new.py").exists()
        assert len(server.requests) == 2 and server.model_lists == 1  # no --model: the server's first one
        assert all(r.get("model") == "scripted-model" for r in server.requests)

        res = _cli(["solve", str(tasks / "1_relu.py"), "--out", str(tmp_path / "solve"), "--device", "cpu"], env)
        assert res.returncode == 0 and "finished earlier" in res.stdout
        assert len(server.requests) == 2  # the finished task was skipped

        settings = tmp_path / "agent.toml"
        settings.write_text('[model]\nmodel = "scripted-model"\n\n[agent]\nmax_turns = 2\n')
        args = ["run", str(tasks), "--out", str(tmp_path / "run"), "-j", "2", "--agent-config", str(settings),
                "--device", "cpu"]
        res = _cli(args, env)
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
        assert [r["task"] for r in rows] == ["1_relu", "2_relu_sq"]
        assert all(r["termination"] == "max_turns" for r in rows)
        # the model is named in the file: its one model list is the check of the server before the run
        assert len(server.requests) == 6 and server.model_lists == 2
        res = _cli(args, env)
        assert res.returncode == 0 and res.stdout.count("finished earlier") == 2
        assert len(server.requests) == 6


def test_tokens_are_estimated_when_the_server_sends_no_usage(task, tmp_path):
    with ScriptedModel([tool("list_files"), tool("read_file", path="model.py")], usage=False) as server:
        result = make_agent(server, tmp_path, task, max_turns=2).run()
    model = [e for e in result_events(tmp_path) if e["type"] == "model"]
    assert all(e["usage_estimated"] and e["prompt_tokens"] > 1000 for e in model)
    assert result.prompt_tokens == sum(e["prompt_tokens"] for e in model)
    assert model[1]["prompt_tokens"] > model[0]["prompt_tokens"]

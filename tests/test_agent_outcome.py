"""How a rollout ends, and what the runner does about it: terminated and truncated kept apart, one
typed error per boundary (provider, judge, interruption, internal) with `retryable`, and reruns that
go by that property alone. Scripted models over loopback HTTP, as in test_agent_loop.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from agent_server import RELU_TASK, ScriptedModel, http_error, tool

from cuda_agent.agent import (Agent, AgentConfig, ChatClient, LocalEvaluator, ModelConfig, Outcome, Reset, StepResult,
                              Termination, Toolbox, Trajectory, Truncation, create_workspace, load_trajectory)
from cuda_agent.rollout.outcome import ErrorInfo, InternalError, Interrupted, JudgeFailure
from cuda_agent.agent.runner import finished, run_tasks, solve_task
from cuda_agent.agent.tools import tool_specs
from cuda_agent.judge import JudgeConfig
from cuda_agent.llm import ContextLengthError, ModelReply, ProviderError
from cuda_agent.tasks import Task

TASK = RELU_TASK


@pytest.fixture
def task() -> Task:
    return Task.from_source(TASK, name="relu")


def client_for(server: ScriptedModel) -> ChatClient:
    return ChatClient(ModelConfig(base_url=server.url, api_key="test-key", model="scripted-model", max_retries=1,
                                  retry_base_s=0.01))


def make_agent(client, root: Path, task: Task, judge: JudgeConfig | None = None, stop=None, **agent) -> Agent:
    config = AgentConfig(**agent)
    box = Toolbox(task, create_workspace(task, root / "ws", "cpu"), LocalEvaluator(judge or JudgeConfig(device="cpu")),
                  config.tools)
    return Agent(client, box, config, Trajectory(root / "trajectory.jsonl"), stop=stop)


class BrokenClient:
    """A model client with a bug: the loop must record it as an internal error, not crash."""

    def describe(self) -> dict:
        return {"broken": True}

    def complete(self, messages, tools) -> ModelReply:
        return {}["no such key"]


# ------------------------------------------------------------------------------------------------ the record
def test_the_error_types_of_each_boundary():
    assert ProviderError("down").retryable and ProviderError("down").kind == "provider"
    assert not ContextLengthError("too long").retryable   # the same conversation is refused again
    assert JudgeFailure("no device").retryable and JudgeFailure("x").kind == "judge"
    assert Interrupted("stop").retryable and Interrupted("x").kind == "interrupted"
    assert not InternalError("bug").retryable and InternalError("x").kind == "internal"
    with pytest.raises(ValueError, match="exactly one"):
        Outcome(truncated=Truncation.MAX_TURNS, error=ErrorInfo(kind="internal", message="x", retryable=False))
    with pytest.raises(ValueError, match="exactly one"):
        Outcome()


def test_truncation_is_recorded_apart_from_termination(task, tmp_path):
    with ScriptedModel(default=tool("list_files")) as server:
        result = make_agent(client_for(server), tmp_path, task, max_turns=2).run()
    assert result.outcome.truncated is Truncation.MAX_TURNS
    assert result.outcome.terminated is None and result.outcome.error is None and not result.submitted
    assert result.termination is Termination.MAX_TURNS  # the one-word reason, as before
    end = load_trajectory(tmp_path / "trajectory.jsonl")[-1]
    assert end["type"] == "end" and end["version"] == 2
    assert (end["termination"], end["terminated"], end["truncated"], end["error"]) == \
        ("max_turns", None, "max_turns", None)


def test_a_provider_error_is_typed_and_retryable(task, tmp_path):
    with ScriptedModel([http_error(401, "invalid api key")]) as server:
        result = make_agent(client_for(server), tmp_path, task, max_turns=5).run()
    error = result.outcome.error
    assert error is not None and error.kind == "provider" and error.retryable and "invalid api key" in error.message
    assert result.termination is Termination.ERROR and result.outcome.truncated is None
    assert result.message.startswith("provider: ")


def test_a_bug_of_the_loop_is_an_internal_error_that_is_not_retried(task, tmp_path):
    result = make_agent(BrokenClient(), tmp_path, task, max_turns=5).run()
    error = result.outcome.error
    assert error.kind == "internal" and not error.retryable and not result.outcome.retryable
    assert "KeyError" in error.message and "Traceback" in error.message


def test_a_stopped_run_is_interrupted(task, tmp_path):
    stop = threading.Event()
    stop.set()
    with ScriptedModel(default=tool("list_files")) as server:
        result = make_agent(client_for(server), tmp_path, task, stop=stop, max_turns=5).run()
    assert result.outcome.error.kind == "interrupted" and result.outcome.retryable
    assert result.turns == 0 and server.requests == []


def test_a_judge_that_cannot_work_is_a_judge_error(task, tmp_path):
    """A CUDA judge on a machine without CUDA: the compile tool reaches the judge, which cannot start."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with ScriptedModel([tool("compile")]) as server:
        result = make_agent(client_for(server), tmp_path, task, judge=JudgeConfig(device="cuda"), max_turns=5).run()
    error = result.outcome.error
    assert error.kind == "judge" and error.retryable and "CUDA is not available" in error.message


class CountdownEnv:
    """A minimal environment (not a Toolbox): the loop needs nothing but reset and step. It ends
    the episode as truncated after `limit` steps."""

    def __init__(self, task: Task, limit: int):
        self.task, self.limit, self.steps = task, limit, []

    def reset(self) -> Reset:
        return Reset(task=self.task, device="cpu", tools=tool_specs())

    def step(self, call) -> StepResult:
        self.steps.append(call.name)
        return StepResult(observation=f"step {len(self.steps)}", truncated=len(self.steps) >= self.limit)

    def close(self) -> None:
        pass


def test_the_loop_talks_to_any_environment(task, tmp_path):
    env = CountdownEnv(task, limit=2)
    with ScriptedModel(default=tool("list_files")) as server:
        result = Agent(client_for(server), env, AgentConfig(max_turns=10), Trajectory()).run()
        assert json.loads(json.dumps(server.requests[1]["tools"])) == tool_specs()
    assert env.steps == ["list_files", "list_files"]
    assert result.outcome.truncated is Truncation.ENVIRONMENT and result.turns == 2


# ------------------------------------------------------------------------------------------------ the runner
def _result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_reruns_retry_by_kind(task, tmp_path):
    gate = LocalEvaluator(JudgeConfig(device="cpu"))
    config = AgentConfig(max_turns=1)
    out = tmp_path / "provider"
    with ScriptedModel([http_error(401, "invalid api key")], default=tool("list_files")) as server:
        first = solve_task(task, out, client_for(server), gate, config)
        assert first["termination"] == "error" and first["error"]["kind"] == "provider"
        assert first["error"]["retryable"] and _result(out)["error"] == first["error"]
        assert finished(out, task) is None
        second = solve_task(task, out, client_for(server), gate, config)   # resumed: a provider error is rerun
        assert second["termination"] == "max_turns" and "resumed" not in second
        assert solve_task(task, out, client_for(server), gate, config)["resumed"]

    out = tmp_path / "internal"
    summary = solve_task(task, out, BrokenClient(), gate, config)
    assert summary["error"]["kind"] == "internal" and not summary["error"]["retryable"]
    again = solve_task(task, out, BrokenClient(), gate, config)
    assert again["resumed"] and again["error"]["kind"] == "internal"  # a bug fails the same way: kept

    # a result.json written before errors had kinds is rerun, as it always was
    legacy = {k: v for k, v in summary.items() if k not in ("error", "terminated", "truncated", "version")}
    (out / "result.json").write_text(json.dumps(legacy))
    assert finished(out, task) is None


def test_retries_run_a_task_again_after_a_retryable_error_only(task, tmp_path):
    gate = LocalEvaluator(JudgeConfig(device="cpu"))
    config = AgentConfig(max_turns=1)
    with ScriptedModel([http_error(401, "invalid api key")], default=tool("list_files")) as server:
        summary = solve_task(task, tmp_path / "a", client_for(server), gate, config, retries=2)
    assert summary["termination"] == "max_turns" and summary["attempts"] == 2
    assert _result(tmp_path / "a")["attempts"] == 2

    summary = solve_task(task, tmp_path / "b", BrokenClient(), gate, config, retries=2)
    assert summary["error"]["kind"] == "internal" and "attempts" not in summary

    with ScriptedModel(default=http_error(401, "invalid api key")) as server:
        rows = run_tasks([task], tmp_path / "run", client_for(server), gate, config, retries=1)
        assert len(server.requests) == 2  # two runs, one request each (a 401 is not retried by the client)
    assert rows[0]["error"]["kind"] == "provider" and rows[0]["attempts"] == 2


def test_solve_prints_the_reason_of_an_error(tmp_path):
    """The reason reaches the terminal, escaped: a message in square brackets is not taken for
    rich markup and swallowed."""
    (tmp_path / "task.py").write_text(TASK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    with ScriptedModel(default=http_error(401, "invalid api key [bold]for[/bold] project [x]")) as server:
        env |= {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test-key", "CUDA_AGENT_MODEL": "scripted-model"}
        res = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "solve", str(tmp_path / "task.py"), "--out",
                              str(tmp_path / "out"), "--device", "cpu"], capture_output=True, text=True, env=env,
                             timeout=600)
    assert res.returncode == 3, res.stderr
    out = " ".join(res.stdout.split())
    assert "error after 0 turns" in out and "provider error" in out
    assert "invalid api key [bold]for[/bold] project [x]" in out
    assert "a rerun starts it again" in out

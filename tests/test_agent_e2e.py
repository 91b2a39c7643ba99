"""A scripted model solves a bundled task end to end through the real client, tools and judge:
CPU backend here (a compile error, its fix, verify, submit); the CUDA backend on a GPU."""

from __future__ import annotations

import pytest
from conftest import judge_cache_dir
from agent_server import ScriptedModel, last_observation, tool, tools

from cuda_agent.agent import (Agent, AgentConfig, ChatClient, LocalEvaluator, ModelConfig, Terminal, Termination, Toolbox,
                              Trajectory, create_workspace, load_trajectory)
from cuda_agent.candidate import Candidate
from cuda_agent.judge import JudgeConfig
from cuda_agent.suite import suite_dir
from cuda_agent.tasks import load_task_file


def expect(*needles: str, then: dict):
    """A script step that checks the last observation before answering."""

    def step(request: dict) -> dict:
        seen = last_observation(request)
        for needle in needles:
            assert needle in seen, f"expected {needle!r} in the observation:\n{seen}"
        return then

    return step


def solution_files(device: str, name: str) -> dict[str, str]:
    root = suite_dir() / "solutions" / device / name
    files = {"model_new.py": (root / "model_new.py").read_text()}
    for path in sorted((root / "kernels").iterdir()):
        files[f"kernels/{path.name}"] = path.read_text()
    return files


def run_agent(script, task, device: str, tmp_path, judge_config: JudgeConfig, max_turns: int):
    with ScriptedModel(script) as server:
        client = ChatClient(ModelConfig(base_url=server.url, api_key="test-key", model="scripted-model"))
        gate = LocalEvaluator(judge_config)
        config = AgentConfig(max_turns=max_turns)
        workspace = create_workspace(task, tmp_path / "ws", device)
        box = Toolbox(task, workspace, gate, config.tools)
        try:
            with Trajectory(tmp_path / "trajectory.jsonl") as trajectory:
                result = Agent(client, box, config, trajectory).run()
        finally:
            box.close()
            gate.close()
    assert not server.errors, server.errors
    return result


@pytest.mark.slow
def test_cpu_run_fixes_a_compile_error_verifies_and_submits(tmp_path):
    task = load_task_file(suite_dir() / "cpu" / "10_RMSNorm.py")
    files = solution_files("cpu", "10_RMSNorm")
    kernel = files["kernels/rmsnorm.cpp"]
    assert "const float feps = (float)eps;" in kernel
    broken = kernel.replace("const float feps = (float)eps;", "const float feps = (float)epsilon;")
    script = [
        tool("profile", target="reference"),
        expect("aten::", "wall time per call", then=tools(
            ("write_file", {"path": "kernels/rmsnorm.cpp", "content": broken}),
            ("write_file", {"path": "kernels/rmsnorm_binding.cpp", "content": files["kernels/rmsnorm_binding.cpp"]}),
            ("write_file", {"path": "model_new.py", "content": files["model_new.py"]}))),
        tool("compile"),
        expect("compile: FAILED", "epsilon", then=tool(
            "edit_file", path="kernels/rmsnorm.cpp", old_text="(float)epsilon", new_text="(float)eps")),
        tool("compile"),
        expect("compile: OK", then=tool("verify")),
        expect("verify: PASSED", "speed-up", then=tool("submit")),
    ]
    cache = tmp_path / "cache"
    config = JudgeConfig(device="cpu", compile_mode="none", n_timed=5, cache_dir=cache)
    result = run_agent(script, task, "cpu", tmp_path, config, max_turns=len(script) + 2)
    assert result.termination is Termination.SUBMITTED, result.message
    assert result.outcome.terminated is Terminal.SUBMITTED and result.outcome.truncated is None
    assert result.turns == len(script)
    assert result.best_verdict is not None and result.best_verdict.correct and result.best_reward.value >= 1
    assert result.best == Candidate.from_path(tmp_path / "ws")
    events = load_trajectory(tmp_path / "trajectory.jsonl")
    judged = [e for e in events if e["type"] == "tool" and e["verdict"]]
    assert [e["name"] for e in judged] == ["verify", "submit"]
    assert judged[0]["verdict"]["correct"] and judged[0]["verdict"]["candidate_hash"] == result.best.hash
    assert events[-1]["type"] == "end" and events[-1]["termination"] == "submitted"
    assert events[-1]["terminated"] == "submitted" and events[-1]["truncated"] is None and events[-1]["error"] is None


@pytest.mark.gpu
def test_cuda_run_solves_a_bundled_level1_task(tmp_path, tmp_path_factory):
    task = load_task_file(suite_dir() / "cuda" / "level1" / "3_Softmax_Rows.py")
    files = solution_files("cuda", "3_Softmax_Rows")
    script = [
        tool("profile", target="reference"),
        expect("aten::", "wall time per call", then=tools(
            *[("write_file", {"path": path, "content": text}) for path, text in files.items()])),
        tool("compile"),
        expect("compile: OK", then=tool("verify")),
        expect("verify: PASSED", then=tool("profile")),
        expect("profile (judge's timing): PASSED", "per-kernel profile", "softmax", then=tool("submit")),
    ]
    config = JudgeConfig(device="cuda", compile_mode="none", n_timed=10,
                         cache_dir=judge_cache_dir(tmp_path_factory))
    result = run_agent(script, task, "cuda", tmp_path, config, max_turns=len(script) + 2)
    assert result.termination is Termination.SUBMITTED, result.message
    v = result.best_verdict
    assert v is not None and v.correct and v.device == "cuda" and result.best_reward.value >= 1
    assert v.speedup_vs_eager is not None

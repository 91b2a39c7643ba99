"""One settings layer for every command: files, typed `-c a.b=value` overrides, errors that say
what is wrong and list the valid names; and no import cycle among the CLI modules or in synth/."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.agent.loop import AgentConfig
from cuda_agent.judge import JudgeConfig
from cuda_agent.settings import SettingsError, apply_overrides, load, parse_value, read_file, split_overrides
from cuda_agent.synth.pipeline import SynthConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "cuda_agent"


def test_file_then_overrides_then_flags(tmp_path):
    path = tmp_path / "judge.toml"
    path.write_text('[judge]\nn_timed = 20\natol = 1e-3\n')
    cfg = load(JudgeConfig, path, ["n_timed=30", "policy=lenient"], section="judge",
               flags={"policy": "strict", "device": None})
    assert cfg.n_timed == 30 and cfg.atol == 1e-3                       # -c over the file
    assert cfg.policy == "strict" and cfg.device == JudgeConfig().device  # a given flag wins; None is unset
    agent_path = tmp_path / "agent.toml"
    agent_path.write_text('[agent]\nmax_turns = 20\n\n[agent.tools]\nobservation_chars = 3000\n')
    agent = load(AgentConfig, agent_path, ["tools.profile_timeout_s=5", "reward.eager_margin=0.1"], section="agent")
    assert agent.tools.observation_chars == 3000 and agent.tools.profile_timeout_s == 5.0   # nested, from both
    assert agent.max_turns == 20 and agent.reward.eager_margin == 0.1
    json_path = tmp_path / "judge.json"
    json_path.write_text(json.dumps({"n_timed": 12}))                   # no section: the whole file
    assert load(JudgeConfig, json_path, section="judge").n_timed == 12


def test_override_values_are_typed():
    assert parse_value("1e-3") == 1e-3 and parse_value("50") == 50 and parse_value("true") is True
    assert parse_value('"x y"') == "x y" and parse_value("[1, 2]") == [1, 2] and parse_value("null") is None
    assert parse_value("cuda") == "cuda"                                # a bare word stays a string
    cfg = load(SynthConfig, None, ["out=runs/x", "filters.max_ms=50", "filters.compile=false", "llm.model=m"])
    assert cfg.filters.max_ms == 50.0 and cfg.filters.compile is False and cfg.llm.model == "m"


@pytest.mark.parametrize("override, needles", [
    ("nope=1", ["JudgeConfig has no field 'nope'", "valid fields:", "n_timed", "atol"]),
    ("reward.eager_margin=0.1", ["JudgeConfig has no field 'reward'"]),   # the judge does not score
    ("n_timed.x=1", ["n_timed is a single value"]),
    ("n_timed=many", ["n_timed", "valid integer", "'many'"]),
    ("atol", ["-c expects key=value"]),
    ("=3", ["-c expects key=value"]),
])
def test_bad_overrides_say_what_is_wrong(override, needles):
    with pytest.raises(SettingsError) as err:
        load(JudgeConfig, None, [override])
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_unknown_name_in_a_file_lists_the_valid_names(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text("max_turn = 5\n")
    with pytest.raises(SettingsError) as err:
        load(AgentConfig, path)
    text = str(err.value)
    assert "max_turn: not a field of AgentConfig" in text and "max_turns" in text and "context_tokens" in text


@pytest.mark.parametrize("name, text, needle", [
    ("empty.toml", "", "the file is empty"),
    ("blank.json", "  \n\n", "the file is empty"),
    ("bad.toml", "n_timed = = 3\n", "not valid TOML"),
    ("bad.json", '{"n_timed": 3,}', "not valid JSON at line 1"),
    ("toml_named.json", "n_timed = 3\n", "needs the .toml suffix"),
    ("list.json", "[1, 2]", "expected a table of settings"),
])
def test_empty_and_malformed_files(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SettingsError) as err:
        read_file(path)
    assert str(path) in str(err.value) and needle in str(err.value), str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(SettingsError, match="no such settings file"):
        read_file(tmp_path / "nope.toml")


def test_overrides_of_a_command_with_several_configs_are_routed():
    routed = split_overrides(["n_timed=5", "judge.atol=0.1", "agent.max_turns=3", "model.temperature=0.2",
                              "reward.fail=-2"], ("judge", "agent", "model"), default="judge")
    assert routed == {"judge": ["n_timed=5", "atol=0.1", "reward.fail=-2"], "agent": ["max_turns=3"],
                      "model": ["temperature=0.2"]}
    assert apply_overrides({"tools": {"observation_chars": 900}}, ["tools.max_file_bytes=10"], AgentConfig) == \
        {"tools": {"observation_chars": 900, "max_file_bytes": 10}}


# -- the commands use it -----------------------------------------------------------------------------

def _cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "CUDA_AGENT_MODEL"))}
    env["CUDA_AGENT_CACHE"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)


TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.randn(8)]\n\n"
        "def get_init_inputs():\n    return []\n")


def test_every_command_refuses_a_bad_override_with_the_valid_names(tmp_path):
    (tmp_path / "task.py").write_text(TASK)
    res = _cli(["eval", "--task", "task.py", "--solution", "task.py", "-c", "n_timd=5"], tmp_path)
    assert res.returncode == 2 and "has no field 'n_timd'" in res.stderr and "n_timed" in res.stderr, res.stderr
    res = _cli(["solve", "task.py", "--device", "cpu", "--base-url", "http://127.0.0.1:9/v1",
                "-c", "agent.max_turn=2"], tmp_path)
    assert res.returncode == 2 and "AgentConfig has no field 'max_turn'" in res.stderr and "max_turns" in res.stderr
    res = _cli(["solve", "task.py", "--device", "cpu", "--base-url", "http://127.0.0.1:9/v1",
                "-c", "model.temperature=hot"], tmp_path)
    assert res.returncode == 2 and "temperature" in res.stderr and "'hot'" in res.stderr, res.stderr
    res = _cli(["synth", "--out", "s", "--device", "cpu", "-c", "filters.max_msec=5"], tmp_path)
    assert res.returncode == 2 and "FilterConfig has no field 'max_msec'" in res.stderr and "max_ms" in res.stderr
    (tmp_path / "empty.toml").write_text("")
    res = _cli(["synth", "--out", "s", "--device", "cpu", "--config", "empty.toml"], tmp_path)
    assert res.returncode == 2 and "the file is empty" in res.stderr, res.stderr
    assert not (tmp_path / "s").exists()


# -- no import cycles ----------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of cuda_agent -> the modules of cuda_agent it imports, at any depth of its code
    (an import inside a function is still an edge: it runs as soon as that function does)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                # `from pkg import submodule` needs the submodule; `from mod import name`, the module
                edges.update(subs if len(subs) == len(node.names) else [base, *subs])
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def cycles(graph: dict[str, set[str]], among: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module in the graph restricted to `among`."""
    sub = {m: graph[m] & among for m in among}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(sub[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(sub):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "cuda_agent.settings" in graph["cuda_agent.synth.cli"]        # imported inside synth_cmd
    assert "cuda_agent.synth.cli" in graph["cuda_agent.cli"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, {"a", "b", "c", "d"}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_clis_or_within_synth():
    graph = import_graph()
    clis = {"cuda_agent.cli", "cuda_agent.agent.cli", "cuda_agent.synth.cli", "cuda_agent.settings"}
    synth = {m for m in graph if m == "cuda_agent.synth" or m.startswith("cuda_agent.synth.")}
    # over the whole graph, so that a cycle through another module counts too
    touching = [c for c in cycles(graph, set(graph)) if set(c) & (clis | synth)]
    assert touching == []


def test_the_cli_routes_reward_settings_away_from_the_judge(tmp_path):
    """`eval` and `bench` read a [reward] table and -c reward.* into RewardConfig, never the judge's."""
    import typer

    from cuda_agent.cli import build_config, build_configs

    path = tmp_path / "settings.toml"
    path.write_text('[judge]\nn_timed = 7\n\n[reward]\ncompile_margin = 0.2\n')
    judge, reward = build_configs(path, ["reward.eager_margin=0.3", "atol=1e-3"], device="cpu")
    assert judge.n_timed == 7 and judge.atol == 1e-3 and judge.device == "cpu"
    assert reward.compile_margin == 0.2 and reward.eager_margin == 0.3
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"n_timed": 9, "reward": {"fail": -2}}))   # a flat file: the reward table is not the judge's
    judge, reward = build_configs(flat, [])
    assert judge.n_timed == 9 and reward.fail == -2
    assert build_config(flat, []).n_timed == 9
    old = tmp_path / "old.toml"
    old.write_text('[judge]\nn_timed = 7\n\n[judge.reward]\nfail = -3.0\n')
    for call in (lambda: build_configs(old, []), lambda: build_config(None, ["reward.fail=-2"])):
        with pytest.raises(typer.Exit) as exit_:
            call()
        assert exit_.value.exit_code == 2

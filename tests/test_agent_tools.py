"""The agent's workspace and tools, without a model: confinement, read-only files, the shell's
limits and environment, truncation, and the SKILL examples against the judge's policy."""

from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path

import pytest

from cuda_agent.agent.tools import Toolbox, ToolConfig, tool_specs, truncate
from cuda_agent.rollout.evaluator import LocalEvaluator
from cuda_agent.agent.workspace import READ_ONLY, create_workspace, skill_text, starter_model_new
from cuda_agent.judge import JudgeConfig
from cuda_agent.judge import policy as pol
from cuda_agent.suite import suite_dir
from cuda_agent.tasks import load_task_file


@pytest.fixture
def task():
    return load_task_file(suite_dir() / "cuda" / "level2" / "1_Linear_Bias_ReLU.py")


@pytest.fixture
def box(task, tmp_path):
    ws = create_workspace(task, tmp_path / "ws", "cpu")
    # the judge is created on first use; none of these tests reaches it
    toolbox = Toolbox(task, ws, LocalEvaluator(JudgeConfig(device="cpu")), ToolConfig(observation_chars=2000))
    yield toolbox
    toolbox.close()


def test_workspace_layout_and_starter(box, task):
    root = box.root
    for name in READ_ONLY:
        assert (root / name).is_file() and not os.access(root / name, os.W_OK) or os.geteuid() == 0
    assert (root / "model.py").read_text() == task.source
    assert (root / "kernels").is_dir()
    starter = (root / "model_new.py").read_text()
    tree = ast.parse(starter)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert cls.name == "ModelNew"
    assert "self.linear = nn.Linear(in_features, out_features, bias=True)" in starter  # the reference's init
    assert "def forward(self, x: torch.Tensor) -> torch.Tensor:" in starter
    # the starter itself is within the strict policy: only the missing kernels stand in the way
    assert pol.check_python(starter, "strict") == []


def test_starter_without_a_constructor():
    src = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n" \
          "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
    starter = starter_model_new(src)
    assert "def forward(self, a, b):" in starter and "super().__init__()" in starter
    assert pol.check_python(starter, "strict") == []


def test_paths_are_confined_to_the_workspace(box, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    for path in ("../secret.txt", str(outside), "kernels/../../secret.txt"):
        obs = box.call("read_file", {"path": path})
        assert not obs.ok and "outside the workspace" in obs.text
        obs = box.call("write_file", {"path": path, "content": "x"})
        assert not obs.ok and "outside the workspace" in obs.text
    (box.root / "kernels" / "link.txt").symlink_to(outside)
    obs = box.call("read_file", {"path": "kernels/link.txt"})
    assert not obs.ok and "outside the workspace" in obs.text
    assert outside.read_text() == "secret"


def test_read_only_files_cannot_be_changed(box, task):
    for name in READ_ONLY:
        obs = box.call("write_file", {"path": name, "content": "changed"})
        assert not obs.ok and "read-only" in obs.text, name
    obs = box.call("edit_file", {"path": "model.py", "old_text": "relu", "new_text": "gelu"})
    assert not obs.ok and "read-only" in obs.text
    (box.root / "kernels" / "alias.py").symlink_to(box.root / "model.py")  # a link inside is no way around
    obs = box.call("write_file", {"path": "kernels/alias.py", "content": "changed"})
    assert not obs.ok and "read-only" in obs.text
    assert (box.root / "model.py").read_text() == task.source


def test_write_read_edit_and_list(box):
    obs = box.call("write_file", {"path": "kernels/op.cpp", "content": "int a = 1;\nint b = 2;\nint a2 = 1;\n"})
    assert obs.ok and "kernels/op.cpp" in obs.text
    obs = box.call("read_file", {"path": "kernels/op.cpp", "start_line": 2, "end_line": 2})
    assert obs.text == "2| int b = 2;"
    obs = box.call("edit_file", {"path": "kernels/op.cpp", "old_text": "= 1;", "new_text": "= 3;"})
    assert not obs.ok and "occurs 2 times" in obs.text
    obs = box.call("edit_file", {"path": "kernels/op.cpp", "old_text": "int b = 2;", "new_text": "int b = 5;"})
    assert obs.ok and "int b = 5;" in obs.text
    obs = box.call("edit_file", {"path": "kernels/op.cpp", "old_text": "= 1;", "new_text": "= 3;", "replace_all": True})
    assert obs.ok and (box.root / "kernels/op.cpp").read_text() == "int a = 3;\nint b = 5;\nint a2 = 3;\n"
    obs = box.call("edit_file", {"path": "kernels/op.cpp", "old_text": "missing", "new_text": "x"})
    assert not obs.ok and "not found" in obs.text
    listing = box.call("list_files", {}).text
    assert "kernels/op.cpp" in listing and "model.py" in listing and "(read-only)" in listing


def test_bad_calls_are_observations(box):
    obs = box.call("rm_rf", {"path": "."})
    assert not obs.ok and "unknown tool" in obs.text and "write_file" in obs.text
    obs = box.call("read_file", {})
    assert not obs.ok and "bad arguments for read_file" in obs.text and "path" in obs.text
    obs = box.call("read_file", {"path": "model.py", "colour": "red"})
    assert not obs.ok and "colour" in obs.text
    obs = box.call("run_shell", {"command": "true", "timeout_s": "soon"})
    assert not obs.ok and "timeout_s" in obs.text
    names = {spec["function"]["name"] for spec in tool_specs()}
    assert names == {"list_files", "read_file", "write_file", "edit_file", "run_shell", "compile", "verify",
                     "profile", "submit"}


def test_shell_runs_in_the_workspace_without_secrets(box, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    monkeypatch.setenv("HF_TOKEN", "hf-secret-value")
    obs = box.call("run_shell", {"command": "pwd; env; echo to-stderr >&2; exit 3"})
    assert not obs.ok and obs.text.startswith("exit code 3")
    assert str(box.root) in obs.text and "to-stderr" in obs.text
    assert "secret-value" not in obs.text
    assert "PATH=" in obs.text


def test_shell_timeout_kills_the_process_group(box, tmp_path):
    pidfile = box.root / "child.pid"
    t0 = time.monotonic()
    obs = box.call("run_shell", {"command": "sleep 300 & echo $! > child.pid; sleep 300", "timeout_s": 2})
    assert time.monotonic() - t0 < 30
    assert "timed out after 2 s" in obs.text and not obs.ok
    child = int(pidfile.read_text())
    for _ in range(50):  # the kill is asynchronous; give the kernel a moment
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("a background child of the timed-out command is still running")


def test_shell_output_is_cut_keeping_errors_and_tail(box):
    cmd = "for i in $(seq 1 3000); do echo line $i; if [ $i = 1500 ]; then echo 'error: boom in the middle'; fi; done"
    obs = box.call("run_shell", {"command": cmd})
    assert obs.ok and len(obs.text) <= 2300
    assert "error: boom in the middle" in obs.text and "line 3000" in obs.text and "lines cut" in obs.text


def test_truncate():
    assert truncate("short", 100) == "short"
    one_line = "x" * 10_000
    cut = truncate(one_line, 1000)
    assert len(cut) < 1100 and "characters cut" in cut
    text = "\n".join([f"noise {i}" for i in range(2000)] + ["fatal error: the real cause"] +
                     [f"noise {i}" for i in range(2000)] + ["the last line"])
    cut = truncate(text, 3000)
    assert len(cut) <= 3100 and cut.startswith("noise 0") and cut.endswith("the last line")
    assert "fatal error: the real cause" in cut


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_skill_examples_pass_the_policy(device):
    """The examples SKILL.md teaches are within the strict policy the judge enforces."""
    text = skill_text(device)
    blocks = re.findall(r"```(cpp|python)\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    for lang, code in blocks:
        if lang == "python":
            assert pol.check_python(code, "strict") == []
        else:
            assert pol.check_cpp(code, "kernels/example", "strict") == []
    for name in ("list_files", "read_file", "write_file", "edit_file", "run_shell", "compile", "verify",
                 "profile", "submit"):
        assert f"`{name}(" in text
    assert "1e-4 for float32" in text


def test_shell_file_size_is_capped(task, tmp_path):
    ws = create_workspace(task, tmp_path / "ws", "cpu")
    box = Toolbox(task, ws, LocalEvaluator(JudgeConfig(device="cpu")), ToolConfig(shell_output_bytes=1 << 20))
    try:
        obs = box.call("run_shell", {"command": "head -c 5000000 /dev/zero > big.bin; echo status $?"})
        assert "status 0" not in obs.text
        assert (ws / "big.bin").stat().st_size <= 1 << 20
        obs = box.call("run_shell", {"command": "ulimit -f unlimited"})  # the limit cannot be lifted
        assert not obs.ok
    finally:
        box.close()

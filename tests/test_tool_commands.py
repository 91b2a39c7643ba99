"""The tools that were scripts under benchmarks/, as commands: `cuda-agent train metrics`,
`cuda-agent synth audit`, `cuda-agent synth decontam` (and synth itself still wants --out)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cuda_agent.cli import app

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "synth_audit"

TASK = '''import torch
import torch.nn as nn

ROWS = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(ROWS, ROWS)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0


def get_inputs():
    return [torch.randn(8, ROWS)]


def get_init_inputs():
    return []
'''


def _run(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200", "TERM": "dumb"})


def test_train_metrics_prints_the_steps_and_the_time_split(tmp_path):
    run = tmp_path / "ppo"
    run.mkdir()
    steps = [{"step": 1, "reward_mean": 0.25, "rollout_s": 30.0, "train_s": 6.0, "generate_s": 20.0, "tool_s": 4.0,
              "judge_s": 12.0, "episodes": 8, "reward_counts": {"correct": 2}, "terminations": {"done": 8}},
             {"step": 2, "reward_mean": 0.5, "rollout_s": 30.0, "train_s": 6.0, "generate_s": 20.0, "tool_s": 4.0,
              "judge_s": 12.0, "episodes": 8, "reward_counts": {"correct": 3}, "terminations": {"done": 8}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    res = _run(["train", "metrics", str(run)])
    assert res.exit_code == 0, res.output
    assert f"== {run} (2 steps)" in res.output
    assert "step\treward_mean\trollout_s\ttrain_s" in res.output
    assert "episodes 16 in 72.0 s: 800 episodes/hour" in res.output
    assert "rewards: {'correct': 5}; terminations: {'done': 16}" in res.output
    missing = _run(["train", "metrics", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no metrics.jsonl" in missing.output


def test_synth_still_needs_an_output_folder():
    res = _run(["synth", "--n", "1"])
    assert res.exit_code == 2 and "--out" in res.output


def test_synth_decontam_catches_edited_copies_and_passes_distinct_tasks(tmp_path):
    bench = tmp_path / "problems"
    bench.mkdir()
    (bench / "l1_p1.py").write_text(TASK)
    (bench / "l1_p2.py").write_text(TASK.replace("torch.relu(self.lin(x)) * 2.0", "torch.tanh(self.lin(x)) + 1.0"))
    out = tmp_path / "decontam.json"
    res = _run(["synth", "decontam", "--bench", str(bench), "--no-trace", "--edit", "rename", "--edit", "noop",
                "--json", str(out)])
    assert res.exit_code == 0, res.output
    figures = json.loads(out.read_text())
    rows = {r["edit"]: r for r in figures["rows"]}
    assert rows["rename"]["total"] == 2 and rows["rename"]["caught"] == 2
    assert rows["noop"]["total"] == 2 and rows["noop"]["not_applicable"] == 0
    assert figures["index"] == 2 and figures["trace"] is False and figures["distinct"] >= 1
    assert figures["false_positives"] == []
    assert "distinct tasks flagged: 0 of" in res.output
    bad = _run(["synth", "decontam", "--bench", str(bench), "--edit", "shuffle"])
    assert bad.exit_code == 2 and "no such edit" in bad.output


def test_synth_audit_finds_the_defects_the_filters_missed(tmp_path):
    """The first audited export's defective tasks (kept as fixtures): the audit's shortcut checks on
    fresh input sets flag them again."""
    name = "3_ceil_Hardshrink_addcmul_instance_norm"
    export = tmp_path / "tasks.jsonl"
    export.write_text(json.dumps({"name": name, "code": (FIXTURES / f"{name}.py").read_text()}) + "\n")
    out = tmp_path / "audit.json"
    res = _run(["synth", "audit", str(export), "--sets", "4", "--checks", "criterion", "--json", str(out)])
    assert res.exit_code == 0, res.output
    figures = json.loads(out.read_text())
    assert figures["tasks"] == 1 and figures["checks"] == "criterion"
    assert "defective on 4 fresh input sets" in res.output
    assert _run(["synth", "audit", str(tmp_path / "none.jsonl")]).exit_code == 2
    assert _run(["synth", "audit", str(export), "--checks", "some"]).exit_code == 2

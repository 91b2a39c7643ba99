"""The pipeline end to end on the CPU: export readable by our loaders (and HF datasets), the CLI
runs in parallel workers, resumes, prints the rejection table and refuses a changed seed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _synth_helpers import torch_catalog
from cuda_agent.synth.catalog import write_catalog
from cuda_agent.synth.filters import FilterConfig
from cuda_agent.synth.pipeline import SynthConfig, read_records, run_synth
from cuda_agent.tasks import iter_jsonl_tasks, iter_parquet_tasks, load_tasks

SUITE = Path(__file__).resolve().parents[1] / "src" / "cuda_agent" / "suite" / "cuda"


@pytest.fixture(scope="module")
def catalog_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.jsonl"
    write_catalog(path, list(torch_catalog()[0]))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, catalog_file):
    out = tmp_path_factory.mktemp("synth")
    cfg = SynthConfig(n=5, out=out, seed=3, workers=2, catalog=catalog_file, benchmark_dir=SUITE,
                      compose={"profile": "cpu"},
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False))
    return cfg, run_synth(cfg)


def test_export_round_trips_through_our_loaders(run):
    cfg, report = run
    assert report.accepted == report.exported == 5
    records = sorted(read_records(cfg.out), key=lambda r: r.index)
    assert [r.index for r in records] == list(range(len(records))) and len(records) == report.candidates
    assert sum(report.rejected_by.values()) + sum(r.accepted for r in records) == report.candidates
    # the table adds up: exported + accepted beyond --n + every rejection = every candidate
    assert report.accepted + report.accepted_not_exported + sum(report.rejected_by.values()) == report.candidates
    assert report.compile_check is False and report.shortcut_checks and report.n_input_sets == 10
    assert report.diversity["tasks"] == 5 and report.diversity["distinct_ops"] >= 1
    for r in records:
        assert r.accepted == (r.rejection is None) and (r.rejection is None or r.rejection.message)
    accepted = [r for r in records if r.accepted][:5]
    for tasks in (list(iter_parquet_tasks(cfg.out / "tasks.parquet")), list(iter_jsonl_tasks(cfg.out / "tasks.jsonl")),
                  load_tasks(cfg.out / "tasks.parquet")):
        assert [t.source for t in tasks] == [r.source for r in accepted]
        for t, r in zip(tasks, accepted):
            assert t.ops == tuple(r.ops) and t.data_source == f"torch#{len(r.ops)}"
            assert t.name == f"{r.index}_{r.name}" and t.metadata["task_id"] == t.id
            assert float(t.metadata["eager_ms"]) == pytest.approx(r.check.eager_ms)
            assert t.metadata["nearest_benchmark"].endswith(".py")
            assert "runtime_window" in json.loads(t.metadata["filter_report"])["passed"]


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="HF datasets not installed")
def test_export_is_readable_by_hf_datasets(run):
    import datasets

    cfg, _ = run
    ds = datasets.load_dataset("parquet", data_files=str(cfg.out / "tasks.parquet"), split="train",
                               cache_dir=str(cfg.out / ".hf-cache"))
    assert len(ds) == 5 and {"ops", "data_source", "code"} <= set(ds.column_names)
    assert json.loads(ds[0]["ops"]) and ds[0]["data_source"].startswith("torch#")


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", "synth", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cli_runs_resumes_and_prints_the_rejection_table(tmp_path, catalog_file):
    out = tmp_path / "out"
    common = ["--out", str(out), "--workers", "2", "--device", "cpu", "--min-ms", "0.02", "--max-ms", "200",
              "--catalog", str(catalog_file), "--seed", "5"]
    first = _cli(["--n", "3", *common])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "removed by each filter" in first.stdout and "accepted" in first.stdout and "tasks/hour" in first.stdout
    before = read_records(out)
    assert sum(r.accepted for r in before) >= 3
    # off a terminal there is no bar: one line per finished candidate, on stderr
    lines = [ln for ln in first.stderr.splitlines() if " candidates] " in ln]
    assert len(lines) == len(before), first.stderr[-3000:]
    assert all(f"{r.index} {r.name}" in "\n".join(lines) for r in before)
    with (out / "candidates.jsonl").open("a") as fh:
        fh.write('{"index": 999, "se')                     # a line cut by an interrupted run
    second = _cli(["--n", "5", *common])
    assert second.returncode == 0, second.stderr[-3000:]
    after = read_records(out)
    indices = [r.index for r in after]
    assert len(indices) == len(set(indices))                 # nothing redone
    assert after[: len(before)] == before                     # the first run's records are kept as they were
    assert len(list(iter_parquet_tasks(out / "tasks.parquet"))) == 5
    third = _cli(["--n", "5", *common[:-1], "6"])            # another seed into the same folder
    assert third.returncode == 3 and "other settings" in third.stderr


def test_time_limit_stops_early_and_exports_what_was_accepted(tmp_path, catalog_file):
    cfg = SynthConfig(n=500, out=tmp_path, seed=5, workers=1, catalog=catalog_file, compose={"profile": "cpu"},
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False),
                      time_limit_s=0.5)
    report = run_synth(cfg)
    assert 0 < report.candidates < 500 and report.accepted < 500
    assert report.exported == report.accepted == len(list(iter_parquet_tasks(tmp_path / "tasks.parquet")))


def test_judge_check_rejects_what_the_judge_fails_and_generates_replacements(tmp_path, catalog_file, monkeypatch):
    """With judge_check every exported task passed the judge's reference checks (real judge, CPU);
    one the judge fails (here: made to fail) is recorded as judge_reference and replaced. Without
    judge_overlap: all checks after the filters (the path that also takes what the stream leaves)."""
    import cuda_agent.synth.pipeline as pipeline
    from cuda_agent.synth.judgecheck import ReferenceCheck

    real = pipeline.check_tasks
    failed: list[str] = []

    def first_fails(items, device, parallel, on_result):
        def relay(check):
            if not failed and check.name == first:
                failed.append(check.name)
                check = ReferenceCheck(name=check.name, ok=False, failure="call 0 (checked): planted mismatch")
            on_result(check)

        first = min((name for name, _ in items), key=lambda n: int(n.split("_")[0]))
        return real(items, device, parallel, on_result=relay)

    monkeypatch.setattr(pipeline, "check_tasks", first_fails)
    cfg = SynthConfig(n=3, out=tmp_path, seed=5, workers=2, catalog=catalog_file, compose={"profile": "cpu"},
                      judge_check=True, judge_overlap=False, judge_parallel=2,
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False))
    report = run_synth(cfg)
    assert report.exported == 3 and report.judge_checked >= 4 and report.rejected_by.get("judge_reference") == 1
    records = {r.index: r for r in read_records(tmp_path)}
    bad = records[int(failed[0].split("_")[0])]
    assert not bad.accepted and bad.rejection.filter == "judge_reference" and "planted" in bad.rejection.message
    exported = list(iter_parquet_tasks(tmp_path / "tasks.parquet"))
    assert failed[0] not in [t.name for t in exported]
    for t in exported:
        rec = records[int(t.name.split("_")[0])]
        assert rec.judge is not None and rec.judge.ok and rec.judge.eager_ms > 0
    # the phases alternate (filter, judge, and again when a replacement was needed), each accepted
    # task is judged once, the one failure is counted; the same rows are in phases.jsonl
    kinds = [p["phase"] for p in report.phases]
    assert kinds[0] == "filter" and kinds[-1] == "judge" and all(a != b for a, b in zip(kinds, kinds[1:]))
    assert sum(p["failed"] for p in report.phases if p["phase"] == "judge") == 1
    assert sum(p["accepted"] for p in report.phases if p["phase"] == "filter") \
        == sum(p["checked"] for p in report.phases if p["phase"] == "judge") == report.judge_checked
    assert [json.loads(line) for line in (tmp_path / "phases.jsonl").read_text().splitlines()] == report.phases


def test_an_interrupted_judge_check_keeps_its_verdicts_and_resumes(tmp_path, catalog_file, monkeypatch):
    import cuda_agent.synth.pipeline as pipeline
    from cuda_agent.synth.judgecheck import ReferenceCheck

    asked: list[list[str]] = []

    def one_then_interrupt(items, device, parallel, on_result):
        asked.append([name for name, _ in items])
        on_result(ReferenceCheck(name=items[0][0], ok=True, eager_ms=1.0))
        if len(asked) == 1:
            raise KeyboardInterrupt     # the first check dies after one verdict
        for name, _ in items[1:]:
            on_result(ReferenceCheck(name=name, ok=True, eager_ms=1.0))
        return {}

    monkeypatch.setattr(pipeline, "check_tasks", one_then_interrupt)
    cfg = SynthConfig(n=2, out=tmp_path, seed=9, workers=1, catalog=catalog_file, compose={"profile": "cpu"},
                      judge_check=True, judge_overlap=False,   # the checks after the filters
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False))
    with pytest.raises(KeyboardInterrupt):
        run_synth(cfg)
    kept = [r for r in read_records(tmp_path) if r.judge is not None]
    assert [f"{r.index}_{r.name}" for r in kept] == [asked[0][0]]
    # the run died in its judge phase: how long it generated and filtered is on disk already
    (phase,) = [json.loads(line) for line in (tmp_path / "phases.jsonl").read_text().splitlines()]
    assert phase["phase"] == "filter" and phase["accepted"] >= 2 and phase["wall_s"] > 0
    report = run_synth(cfg)                         # resumed: only the unjudged are asked for
    assert asked[0][0] not in asked[1] and set(asked[1]) == set(asked[0][1:])
    assert report.exported == 2


def test_judge_overlap_checks_beside_the_filters_and_replaces_a_failure(tmp_path, catalog_file, monkeypatch):
    """With judge_overlap the judges take each task as the filters accept it (real judges, CPU): no
    judge phase after the filters, every exported task judged, a failure among them replaced."""
    import cuda_agent.synth.pipeline as pipeline
    from cuda_agent.synth.judgecheck import JudgeStream, ReferenceCheck

    failed: list[str] = []

    class FirstFails(JudgeStream):
        def results(self, timeout: float = 0.0):
            out = super().results(timeout)
            if out and not failed:
                failed.append(out[0].name)
                out[0] = ReferenceCheck(name=out[0].name, ok=False, failure="call 0 (checked): planted mismatch")
            return out

    monkeypatch.setattr(pipeline, "JudgeStream", FirstFails)
    monkeypatch.setattr(pipeline, "check_tasks", lambda *a, **k: pytest.fail("nothing is left for after the filters"))
    cfg = SynthConfig(n=3, out=tmp_path, seed=5, workers=2, catalog=catalog_file, compose={"profile": "cpu"},
                      judge_check=True, judge_overlap=True, judge_parallel=2,
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False))
    report = run_synth(cfg)
    assert report.exported == 3 and report.rejected_by.get("judge_reference") == 1
    records = {r.index: r for r in read_records(tmp_path)}
    bad = records[int(failed[0].split("_")[0])]
    assert not bad.accepted and bad.rejection.filter == "judge_reference"
    for t in iter_parquet_tasks(tmp_path / "tasks.parquet"):
        rec = records[int(t.name.split("_")[0])]
        assert rec.judge is not None and rec.judge.ok and rec.judge.eager_ms > 0
    assert [p["phase"] for p in report.phases] == ["filter"]
    # every task the filters accepted was checked, within the filter phase
    (phase,) = report.phases
    assert phase["checked"] == report.judge_checked == phase["accepted"] + phase["failed"] and phase["failed"] == 1


def test_a_judge_that_dies_leaves_its_task_unjudged_and_is_replaced():
    """A task that takes its judge process down (the reference is loaded in the judge's own
    process first) is not answered: it is left for the checks after the filters, and the next
    task is judged by the judge started in its place."""
    from cuda_agent.synth.judgecheck import JudgeStream

    good_src = (SUITE.parent / "cpu" / "10_RMSNorm.py").read_text()
    stream = JudgeStream("cpu", 1)
    try:
        stream.submit("0_dies", good_src + "\n\nimport os\nos._exit(3)\n")
        stream.submit("1_good", good_src)
        got = []
        deadline = time.monotonic() + 240
        while stream.in_flight and time.monotonic() < deadline:
            got += stream.results(timeout=1.0)
        assert stream.unjudged == ["0_dies"]
        assert [(c.name, c.ok) for c in got] == [("1_good", True)], got
        assert stream.alive()
    finally:
        stream.close()
    assert not stream.alive()


def test_an_interrupted_overlapped_run_keeps_its_verdicts_and_the_resume_judges_the_rest(tmp_path, catalog_file,
                                                                                         monkeypatch):
    """Killed while the judges work beside the filters: the verdicts already in are on disk, and the
    resumed run hands the accepted but unjudged tasks to its judges first."""
    import cuda_agent.synth.pipeline as pipeline
    from cuda_agent.synth.judgecheck import JudgeStream

    class DiesAfterOne(JudgeStream):
        answered = False

        def results(self, timeout: float = 0.0):
            if self.answered:   # the run is interrupted at its next look for verdicts
                raise KeyboardInterrupt
            out = super().results(timeout)[:1]
            self.answered = bool(out)
            return out

    monkeypatch.setattr(pipeline, "JudgeStream", DiesAfterOne)
    cfg = SynthConfig(n=3, out=tmp_path, seed=11, workers=2, catalog=catalog_file, compose={"profile": "cpu"},
                      judge_check=True, judge_overlap=True, judge_parallel=2,
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=60, compile=False))
    with pytest.raises(KeyboardInterrupt):
        run_synth(cfg)
    first = read_records(tmp_path)
    assert sum(r.judge is not None for r in {r.index: r for r in first}.values()) == 1
    monkeypatch.setattr(pipeline, "JudgeStream", JudgeStream)
    fed: list[str] = []
    real_submit = JudgeStream.submit
    monkeypatch.setattr(JudgeStream, "submit", lambda self, name, source: (fed.append(name),
                                                                           real_submit(self, name, source))[1])
    report = run_synth(cfg)
    assert report.exported == 3
    latest = {r.index: r for r in read_records(tmp_path)}
    judged_before = {i for i, r in {r.index: r for r in first}.items() if r.judge is not None}
    assert not judged_before & {int(n.split("_")[0]) for n in fed}   # judged once, never again
    for t in iter_parquet_tasks(tmp_path / "tasks.parquet"):
        assert latest[int(t.name.split("_")[0])].judge.ok


# -- round three: the export criterion over whole runs, and the audit's tasks from their seeds ------

AUDIT = Path(__file__).resolve().parent / "fixtures" / "synth_audit"


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_no_exported_task_fails_the_criterion_on_fresh_sets(tmp_path, catalog_file, seed):
    """A small run per seed: every exported task passes the export criterion again on 30 input sets
    drawn under seeds the filters never used; the report's hazard counts come from its table."""
    from cuda_agent.synth.criterion import check_task
    from cuda_agent.synth.filters import FILTERS, HAZARD_FILTERS

    cfg = SynthConfig(n=3, out=tmp_path, seed=seed, workers=2, catalog=catalog_file, compose={"profile": "cpu"},
                      filters=FilterConfig(device="cpu", min_ms=0.02, max_ms=200, n_timed=3, timeout_s=120,
                                           compile=False))
    report = run_synth(cfg)
    assert report.exported == 3 and report.criterion and report.hazard_guards
    assert set(report.rejected_by) <= set(FILTERS)
    assert report.hazard_rejections == {f: c for f, c in report.rejected_by.items() if f in HAZARD_FILTERS}
    assert report.hazard_share == pytest.approx(sum(report.hazard_rejections.values()) / report.candidates, abs=1e-4)
    for t in iter_parquet_tasks(tmp_path / "tasks.parquet"):
        assert "criterion" in json.loads(t.metadata["filter_report"])["passed"]
        res = check_task(t.source, sets=30, seed=90_000 + seed, name=t.name)
        assert res.ok, (t.name, res.filter, res.message)


def test_the_audits_tasks_come_from_their_seeds_and_the_guarded_composer_avoids_them(tmp_path):
    """The three defective tasks of the round-two audit are what the composer of that round made
    from seeds 7 * 10^7 + 3, 5, 54 with the full catalog (crawled here, in its child process);
    the hazard-aware composer no longer runs their jump or unguarded pole on those seeds."""
    import torch

    from cuda_agent.synth.catalog import load_or_crawl
    from cuda_agent.synth.compose import ComposeConfig, ProgrammaticComposer

    fixtures = sorted(AUDIT.glob("*.py"))
    if f"torch {torch.__version__}" not in fixtures[0].read_text().splitlines()[0]:
        pytest.skip("the fixtures were composed with another torch (the catalog it crawls differs)")
    seeds = load_or_crawl(tmp_path / "catalog.jsonl")
    old = ProgrammaticComposer(seeds, ComposeConfig(profile="cpu", hazard_guards=False))
    new = ProgrammaticComposer(seeds, ComposeConfig(profile="cpu"))
    for path in fixtures:
        index = int(path.name.split("_")[0])
        assert old.compose(7 * 10_000_000 + index).source == path.read_text()
        again = new.compose(7 * 10_000_000 + index)
        assert not {"torch.ceil", "nn.Hardshrink", "torch.remainder"} & set(again.ops), again.source
        # a reciprocal only of a guarded operand (p<i>_<j> = <value>.abs() + 1.0)
        for arg in re.findall(r"torch\.reciprocal\((\w+)\)", again.source):
            assert re.search(rf"^\s*{arg} = \w+(\.\w+)?\.abs\(\) \+ 1\.0$", again.source, re.M), again.source

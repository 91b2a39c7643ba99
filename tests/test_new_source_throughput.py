"""cuda_agent.fidelity.new_source (benchmarks/new_source_throughput.py): the report of a cold run (no device,
nothing judged here; the run itself is the lead's, on the GPU machine)."""

from __future__ import annotations

import json

import pytest

from cuda_agent.fidelity import new_source as nst


def _entry(key, task, judged_at, verdict=None, error=None):
    return {"key": key, "task": task, "judged_at": judged_at, "verdict": verdict, "error": error}


def _verdict(correct, judge_s, **phases):
    return {"correct": correct, "judge_s": judge_s, "phase_s": phases, "build_cached": False,
            "failure": None if correct else {"category": "mismatch", "message": "x"}}


ENTRIES = [
    _entry("a", "t1", 100.0, _verdict(True, 20.0, pool_queue=1.0, prebuild=30.0, build=0.5, baseline=12.0,
                                      start=3.0, calls=4.0)),
    _entry("b", "t1", 110.0, _verdict(False, 8.0, pool_queue=5.0, build=2.0, start=3.0, calls=2.0)),
    _entry("c", "t2", 130.0, error={"kind": "judge_error", "message": "baseline failed"}),
]


def test_throughput_is_per_gpu_hour_over_the_whole_run_and_the_steady_part():
    r = nst.summarize(ENTRIES, wall_s=360.0, gpus=1, judges=1)
    assert r["candidates"] == 3 and r["verdicts"] == 2 and r["correct"] == 1 and r["tasks"] == 2
    assert r["per_gpu_hour"] == pytest.approx(3 / 0.1)             # 3 candidates in 360 s
    assert r["steady_per_gpu_hour"] == pytest.approx(2 / (30 / 3600))  # 2 more verdicts in the 30 s after the first
    assert r["failed_by_category"] == {"mismatch": 1} and r["errors_by_kind"] == {"judge_error": 1}
    assert nst.summarize(ENTRIES, wall_s=360.0, gpus=2, judges=2)["per_gpu_hour"] == pytest.approx(15.0)


def test_the_report_counts_the_cuda_builds_by_the_header_they_were_compiled_with():
    entries = [_entry(k, "t", 100.0 + i, dict(_verdict(True, 5.0), build_headers=h))
               for i, (k, h) in enumerate((("a", ["ops"]), ("b", ["light"]), ("c", ["ops", "torch"]), ("d", [])))]
    r = nst.summarize(entries, wall_s=60.0, gpus=1, judges=1)
    assert r["build_headers"] == {"ops": 2, "light": 1, "torch": 1}
    assert "{'ops': 2, 'light': 1, 'torch': 1}" in nst.render(r)
    assert nst.summarize(ENTRIES, wall_s=60.0, gpus=1, judges=1)["build_headers"] == {}  # verdicts before the field


def test_where_the_time_goes_splits_the_judges_time_and_counts_the_rest_as_other():
    r = nst.summarize(ENTRIES, wall_s=100.0, gpus=1, judges=1)
    total = r["phase_s_total"]
    assert total["prebuild"] == 30.0 and total["baseline"] == 12.0 and total["calls"] == 6.0
    assert total["other"] == pytest.approx((20 - 19.5) + (8 - 7))
    assert r["phase_s_per_candidate"]["pool_queue"] == 3.0
    assert r["judge_busy"] == pytest.approx(28 / 100)
    assert r["built_ahead"] == 1
    assert "judged per GPU-hour" in nst.render(r)


def test_a_run_is_cold_or_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "verdicts.jsonl").write_text("")
    args = nst.parse_args(["--corpus", str(tmp_path), "--out", str(out)])
    with pytest.raises(nst.fidelity.UsageError, match="cold run"):
        nst.run(args)


def test_report_only_reads_what_out_holds(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "verdicts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ENTRIES))
    (out / nst.REPORT_FILE).write_text(json.dumps({"wall_s": 360.0, "gpus": 1, "judge_workers": 1}))
    r = nst.run(nst.parse_args(["--out", str(out), "--report-only"]))
    assert r["candidates"] == 3 and r["per_gpu_hour"] == pytest.approx(30.0)


def test_a_run_reads_the_corpus_builds_its_config_and_reports_even_when_cut_short(tmp_path, monkeypatch):
    """The run's own steps with the pool stood in (it judges in the fidelity tests and on the GPU):
    the corpus read and sampled, the judge settings from -c, a cold cache under OUT, and a report
    that a run killed by a time limit still gets from --report-only (its judges and wall time)."""
    from test_fidelity import make_corpus

    corpus = make_corpus(tmp_path / "corpus")
    seen = {}

    def judge_records(records, out, config, pool_config, done):
        seen.update(keys=[r.key for r in records], config=config, judges=pool_config.judges_per_gpu)
        start = json.loads((out / nst.REPORT_FILE).read_text())["started_at"]
        with open(out / nst.fidelity.VERDICTS_FILE, "a") as fh:
            for k, r in enumerate(records):
                fh.write(json.dumps(_entry(r.key, r.task_name, start + 10.0 * (k + 1),
                                           _verdict(True, 5.0, build=1.0, calls=2.0))) + "\n")
        raise KeyboardInterrupt   # the time limit's kill, before the run writes its report

    monkeypatch.setattr(nst.fidelity, "judge_records", judge_records)
    out = tmp_path / "out"
    args = nst.parse_args(["--corpus", str(corpus), "--out", str(out), "--sample", "3", "--device", "cpu",
                           "--judges-per-gpu", "2", "-c", "n_timed=7"])
    with pytest.raises(KeyboardInterrupt):
        nst.run(args)
    assert len(seen["keys"]) == 3 and seen["config"].n_timed == 7 and seen["judges"] == 2
    assert seen["config"].cache_dir == out / "cache" and (out / "work").is_dir()
    r = nst.run(nst.parse_args(["--out", str(out), "--report-only"]))
    assert r["candidates"] == 3 and r["wall_s"] == pytest.approx(30.0, abs=1.0)
    assert r["per_gpu_hour"] == pytest.approx(3 / (r["wall_s"] / 3600)) and r["settings"]["n_timed"] == 7

"""The HTML report: its content, and that it renders in a real headless browser (Debian's Chromium)
without script errors, with its tables built and its plots decoded."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from cuda_agent.candidate import Candidate
from cuda_agent.db import ResultsDB
from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict
from cuda_agent.report_html import render_report, write_report
from cuda_agent.reward import reward_of
from cuda_agent.tasks import Task

TASK = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\n" \
       "def get_init_inputs():\n    return []\n# {name}\n"


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5)


def add(db: ResultsDB, run: str, name: str, level: int, runtime_ms: float | None, failure: str = "") -> None:
    """One judged task: a workspace whose kernel names the run, correct with `runtime_ms`, or failed."""
    task = Task.from_source(TASK.format(name=name), name=name, level=level)
    cand = Candidate.from_files("import cuda_extension\nclass ModelNew: pass\n",
                                {f"{name}.cu": f"// {run} <kernel & friends>\n__global__ void k() {{}}\n"},
                                origin=f"/solutions/{run}/{name}")
    v = Verdict(task_id=task.id, task_name=name, candidate_hash=cand.hash, device="cuda", device_name="NVIDIA H200",
                compiled=True, eager=timing(2.0), compiled_ref=timing(1.6), compile_mode="default")
    if failure:
        v.failure = Failure(category=FailureCategory.MISMATCH, message=failure)
    else:
        v.correct, v.runtime = True, timing(runtime_ms)
    db.add_verdict(run, task, cand, v, reward=reward_of(v).value)


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultsDB(path) as db:
        for run in ("base", "new"):
            db.open_run(run, spec="kernelbench", device="cuda", settings_digest="d",
                        info={"config": {"n_timed": 20}, "missing": [{"name": "9_Missing", "level": 2}]})
        add(db, "base", "1_Relu", 1, 1.0)
        add(db, "base", "2_Gemm", 1, 4.0)
        add(db, "base", "1_Fused", 2, None, failure="call 3: max abs error 0.5 > atol <script>alert(1)</script>")
        add(db, "new", "1_Relu", 1, 0.5)
        add(db, "new", "2_Gemm", 1, 1.0)
        add(db, "new", "1_Fused", 2, 1.25)
        add_pairs(db)
    return path


def add_pairs(db: ResultsDB) -> None:
    """Run "pairs": one reference source under two task names, each with its own solution (one
    correct at 2.0x, one wrong), and a task whose eager baseline failed (no verdict)."""
    db.open_run("pairs", spec="kernelbench", device="cuda", settings_digest="d", info={"config": {}})
    source = TASK.format(name="softmax")
    for name, runtime_ms in (("3_Softmax", 1.0), ("3_Softmax_again", None)):
        task = Task.from_source(source, name=name, level=1)
        cand = Candidate.from_files(f"class ModelNew: pass\n# {name}\n", {}, origin=f"/solutions/pairs/{name}.py")
        v = Verdict(task_id=task.id, task_name=name, candidate_hash=cand.hash, device="cuda",
                    device_name="NVIDIA H200", compiled=True, eager=timing(2.0))
        if runtime_ms is None:
            v.failure = Failure(category=FailureCategory.MISMATCH, message="max abs error 3")
        else:
            v.correct, v.runtime = True, timing(runtime_ms)
        db.add_verdict("pairs", task, cand, v, reward=reward_of(v).value)
    broken = Task.from_source(TASK.format(name="broken"), name="5_Broken", level=1)
    db.add_failure("pairs", broken, Candidate.from_files("class ModelNew: pass\n# b\n", {}, origin="/s/5_Broken.py"),
                   "baseline", "task 5_Broken: eager baseline failed: worker setup failed: <RuntimeError>")


def test_every_pair_and_every_judge_failure_is_in_the_report(db_path):
    with ResultsDB(db_path) as db:
        text = render_report(db, ["pairs"])
    assert text.count('<tr data-task="') == 3
    assert '<tr data-task="3_Softmax" data-judged="yes">' in text
    assert '<tr data-task="3_Softmax_again" data-judged="yes">' in text
    assert '<tr data-task="5_Broken" data-judged="no">' in text
    assert "not judged: baseline" in text and "&lt;RuntimeError&gt;" in text
    assert "3 (task, candidate) pairs of 2 tasks" in text
    assert re.search(r"candidate failures</th><td>mismatch: 1</td>", text)
    assert re.search(r'not judged</th><td class="bad">baseline: 1 ', text)
    # per pair: 3 pairs, 1 correct, 1 not judged; per task (best of): 2 tasks, 1 correct, 1 not judged
    assert re.search(r"overall</td><td>3</td>\s*<td>33.3%</td><td>1</td>", text)
    assert "per task, best of its candidates" in text
    assert re.search(r"overall</td><td>2</td>\s*<td>50.0%</td><td>1</td>", text)
    # a run with one candidate per task has no best-of table
    with ResultsDB(db_path) as db:
        assert "best of its candidates" not in render_report(db, ["base"])


def test_report_content(db_path):
    with ResultsDB(db_path) as db:
        text = render_report(db, ["base"])
    assert text.count('<tr data-task="') == 3
    assert "2.00x" in text and "0.50x" in text            # 1_Relu and 2_Gemm vs eager
    assert "mismatch" in text and "/solutions/base/1_Relu" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "<script>alert(1)" not in text
    assert "&lt;kernel &amp; friends&gt;" in text, "the solution's source is inline, escaped"
    assert "enters with speed-up 1.0" in text
    # level 1: two correct of two; level 2: the failure
    assert re.search(r"level 1</td><td>2</td>\s*<td>100.0%</td>", text)
    assert re.search(r"level 2</td><td>1</td>\s*<td>0.0%</td>", text)
    assert "<link" not in text and "http://" not in text and "https://" not in text, "self-contained"
    with ResultsDB(db_path) as db:
        counted = render_report(db, ["base"], count_missing=True)
    assert re.search(r"level 2</td><td>2</td>", counted)


def test_comparison_of_two_runs(db_path):
    with ResultsDB(db_path) as db:
        text = render_report(db, ["base", "new"])
    assert "Side by side" in text and text.count("<img") == 3
    assert "4.00x" in text  # 2_Gemm went from 4.0 ms to 1.0 ms: B / A = 4.00x
    with ResultsDB(db_path) as db, pytest.raises(KeyError, match="base, new|new, base"):
        render_report(db, ["nope"])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
@pytest.mark.parametrize("runs", [["base"], ["base", "new"], ["pairs"]], ids=["one-run", "two-runs", "pairs"])
def test_report_renders_in_headless_chromium(db_path, tmp_path, runs):
    out = write_report(db_path, runs, tmp_path / "report.html")
    profile = tmp_path / "chromium-profile"
    res = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, f"the page logged to the console (script errors): {console}"
    dom = res.stdout
    rows = 3 * len(runs)  # three rows in each run
    assert f'data-ready="{rows}"' in dom, "the inline script did not run to its end"
    assert f'data-plots="{len(runs) + 1}/{len(runs) + 1}"' in dom, "a plot did not decode"
    assert "CUDA Agent Table 1 metrics" in dom


# Appended to a copy of the report: opens every row's details, then records on <body> how far the
# widest element reaches past the window's right edge, in CSS pixels (0: nothing runs off).
MEASURE = """<script>
window.addEventListener("load", function () {
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  const width = document.documentElement.clientWidth;
  let worst = 0, what = "";
  document.querySelectorAll("pre, table").forEach(function (el) {
    const over = el.getBoundingClientRect().right - width;
    if (over > worst) { worst = over; what = el.tagName + (el.className ? "." + el.className.split(" ").join(".") : ""); }
  });
  document.body.dataset.overflow = Math.ceil(worst) + ":" + what;
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_an_expanded_row_stays_inside_the_window(tmp_path):
    """A solution with long source lines, every row expanded, in a 1280-pixel window: no source
    block and no table reaches past the right edge (long lines scroll inside their block)."""
    path = tmp_path / "wide.sqlite"
    with ResultsDB(path) as db:
        db.open_run("wide", spec="kernelbench", device="cuda", settings_digest="d", info={"config": {}})
        task = Task.from_source(TASK.format(name="wide"), name="1_A_Rather_Long_Task_Name_For_A_Fused_Kernel", level=1)
        line = "    out[i] = " + " + ".join(f"in{k}[i] * w{k}" for k in range(60)) + ";\n"
        cand = Candidate.from_files("import cuda_extension\nclass ModelNew: pass\n",
                                    {"wide.cu": "__global__ void k() {\n" + line * 3 + "}\n"}, origin="/s/wide")
        v = Verdict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cuda", device_name="H200",
                    compiled=True, correct=True, eager=timing(2.0), runtime=timing(1.0))
        db.add_verdict("wide", task, cand, v, reward=reward_of(v).value)
    out = write_report(path, ["wide"], tmp_path / "wide.html")
    page = tmp_path / "measured.html"
    page.write_text(out.read_text().replace("</body>", MEASURE + "</body>"))
    res = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1280,900",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    found = re.search(r'data-overflow="(-?\d+):([\w.]*)"', res.stdout)
    assert found, "the measuring script did not run"
    assert int(found.group(1)) <= 0, f"a {found.group(2)} runs {found.group(1)} px past the window's right edge"


def test_histogram_counts_are_whole_numbers(db_path):
    """The speed-up histograms count tasks: their y axis has integer ticks only."""
    import base64

    from cuda_agent.report_html import load_run, speedup_histogram

    with ResultsDB(db_path) as db:
        uri = speedup_histogram([load_run(db, "base")])
    svg = base64.b64decode(uri.split(",", 1)[1]).decode()
    ticks = re.findall(r"<!-- (-?[\d.]+) -->", svg)  # matplotlib names each text it draws in a comment
    assert ticks, "no tick labels found in the plot"
    assert all(float(t) == int(float(t)) for t in ticks), ticks


def test_report_command_writes_the_file(db_path, tmp_path):
    out = tmp_path / "cmp.html"
    res = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "report", "base", "new", "--db", str(db_path),
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert out.exists() and "Side by side" in out.read_text()
    res = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "report", "nope", "--db", str(db_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no run named 'nope'" in res.stderr
    res = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "runs", "--db", str(db_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "base" in res.stdout and "3 verdicts, 0 not judged" in res.stdout
    assert "2 verdicts, 1 not judged" in res.stdout  # run "pairs"

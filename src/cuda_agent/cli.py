"""`cuda-agent`: judge candidates, benchmark task suites.

Exit codes, the same for every command: 0 a verdict (or table) was produced, even for failing
candidates; 2 usage error (a missing or unknown option, a bad setting, a path that does not exist,
a bench with no solutions to judge); 3 the work could not be done (no such device, a file that is
not a task, the model server down, a broken installation).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from cuda_agent.console import make_console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None)
err = make_console(stderr=True)
EXIT_JUDGE = 3

DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cuda or cpu (default: cuda when available, else the CPU backend)")]
PolicyOpt = Annotated[Optional[str], typer.Option(
    "--policy", help="strict (CUDA Agent skill: no PyTorch compute in forward) or lenient (torch glue allowed)")]
CompileOpt = Annotated[Optional[str], typer.Option(
    "--compile-mode", help="torch.compile mode of the compiled baseline: default, reduce-overhead, "
                           "max-autotune, max-autotune-no-cudagraphs, or none to skip it")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", help="settings from a TOML or JSON file: fields of JudgeConfig (its [judge] table, or the whole "
                     "file) and, for the commands that score, a [reward] table of RewardConfig fields")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "-c", "--set", help="override one JudgeConfig field, e.g. -c atol=1e-3 -c n_timed=50; on eval and bench "
                        "also a RewardConfig field: -c reward.eager_margin=0.1")]


def _fail(message: str, code: int = EXIT_JUDGE) -> None:
    err.print(f"[red]error:[/red] {escape(message)}")  # messages quote paths and code: never markup
    raise typer.Exit(code)


def _existing(path: Path, what: str) -> Path:
    """A path the user named must exist: a usage error (2) otherwise, as for every command."""
    if not path.exists():
        _fail(f"{path}: no such {what}", 2)
    return path


def _device_or_exit(device: str) -> None:
    """--device cuda without a usable GPU ends the command before anything is built or stored."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail("device 'cuda' requested but CUDA is not available (use --device cpu)")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cuda-agent {version('cuda-agent')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("cuda-agent (not installed; run from source)")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                                help="print the version and exit")] = False) -> None:
    """Agentic RL for CUDA kernels: an honest, fast judge for candidate kernels, and an agent that writes them.

    Exit codes of every command: 0 done (a verdict or a table, even for failing candidates), 2 usage error, 3 the work could not be done (no device, not a task, the model server down)."""


def build_config(config: Optional[Path], sets: Optional[list[str]], **flags):
    """The judge's settings: the file (its [judge] table, or all of it), then -c, then the flags;
    any mistake in them is a usage error (exit 2) that says what is wrong."""
    return build_configs(config, sets, scores=False, **flags)[0]


def build_configs(config: Optional[Path], sets: Optional[list[str]], *, scores: bool = True, **flags):
    """The judge's settings and, for a command that scores verdicts (`scores`), the reward's: the
    file's [reward] table and the `-c reward.FIELD=value` items go to RewardConfig, the rest to
    the judge as in `build_config`. The judge never sees the reward: a verdict measures, its
    reader scores."""
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.reward import RewardConfig
    from cuda_agent.settings import SettingsError, apply_overrides, read_file, split_overrides, validate

    try:
        routed = split_overrides(sets, ("reward",) if scores else (), default="judge")
        values = read_file(config)
        sectioned = isinstance(values.get("judge"), dict)
        # A file may hold several commands' settings: the reward's table is never the judge's.
        judge_part = dict(values["judge"]) if sectioned else {k: v for k, v in values.items() if k != "reward"}
        if "reward" in judge_part:
            raise SettingsError(f"{config}: the reward is not a judge setting (the judge only measures); move "
                                f"[judge.reward] to a top-level [reward] table")
        reward_part = values.get("reward", {})
        if not isinstance(reward_part, dict):
            raise SettingsError(f"{config}: reward must be a table of RewardConfig fields")
        judge_values = apply_overrides(judge_part, routed["judge"], JudgeConfig)
        judge_values.update({k: v for k, v in flags.items() if v is not None})
        judge = validate(JudgeConfig, judge_values, "judge settings")
        reward = (validate(RewardConfig, apply_overrides(reward_part, routed["reward"], RewardConfig),
                           "reward settings") if scores else None)
    except SettingsError as exc:
        _fail(str(exc), 2)
    return judge, reward


@app.command("eval")
def eval_cmd(
    task: Annotated[Path, typer.Option("--task", help="reference module in KernelBench format (Model, get_inputs, get_init_inputs)")],
    solution: Annotated[Path, typer.Option("--solution", help="a single-file ModelNew module (load_inline) or a CUDA Agent workspace folder")],
    as_json: Annotated[bool, typer.Option("--json", metavar="", help="print one JSON object (the verdict summary)")] = False,
    full: Annotated[bool, typer.Option("--full", metavar="", help="with --json: the whole verdict, per-call records included")] = False,
    device: DeviceOpt = None, policy: PolicyOpt = None, compile_mode: CompileOpt = None,
    config: ConfigOpt = None, set_: SetOpt = None,
) -> None:
    """Judge one candidate: compile, verify on fresh inputs, time against eager and torch.compile, reward.

    Exit 0 whenever a verdict was produced, including for failing candidates.
    """
    from cuda_agent.candidate import Candidate, CandidateError
    from cuda_agent.judge import Judge, JudgeError
    from cuda_agent.tasks import TaskError, load_task_file

    _existing(task, "task file")
    _existing(solution, "solution file or workspace folder")
    cfg, reward = build_configs(config, set_, device=device, policy=policy, compile_mode=compile_mode)
    try:
        t = load_task_file(task)
    except TaskError as exc:
        _fail(str(exc))
    try:
        cand = Candidate.from_path(solution)
    except CandidateError as exc:
        _fail(str(exc), 2)
    try:
        with Judge(cfg) as judge:
            verdict = judge.evaluate(t, cand)
    except JudgeError as exc:
        _fail(str(exc))
    from cuda_agent.reward import reward_of, scored_summary

    if as_json:
        summary = scored_summary(verdict, reward)
        out = verdict.model_dump(mode="json") | summary if full else summary
        sys.stdout.write(json.dumps(out, indent=None if not full else 1) + "\n")
    else:
        from cuda_agent.report import print_verdict

        print_verdict(verdict, reward_of(verdict, reward))


@app.command("bench")
def bench_cmd(
    tasks: Annotated[str, typer.Argument(help="'suite' (bundled), a KernelBench-style folder, a task .py, "
                                              "or an Ops-6K .jsonl/.parquet file")] = "suite",
    solutions: Annotated[Optional[Path], typer.Option(
        "--solutions", help="folder of solutions named by task (NAME.py or NAME/ workspace); "
                            "default for the suite: its bundled solutions")] = None,
    level: Annotated[Optional[list[int]], typer.Option("--level", help="only these levels")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="write the run's verdicts as JSON lines here")] = None,
    db: Annotated[Optional[Path], typer.Option(
        "--db", help="results database (default: $CUDA_AGENT_DB or results.sqlite in the cache folder)")] = None,
    run: Annotated[Optional[str], typer.Option(
        "--run", help="run name; an existing run resumes, judging only what it lacks "
                      "(default: a new run named after the tasks, device and time)")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="judge workers (cuda: default --judges-per-gpu per visible GPU; cpu: default 1)")] = None,
    judges_per_gpu: Annotated[int, typer.Option(
        "--judges-per-gpu", help="cuda: judge workers sharing each GPU; they check candidates at once and take "
                                 "turns for the timed calls, each alone on the GPU")] = 1,
    compile_workers: Annotated[Optional[int], typer.Option(
        "--compile-workers", help="workers building candidates ahead (default: the spare cores; 0: none)")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="seconds one candidate may hold a judge worker before it is replaced")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="also write the run's HTML report here")] = None,
    count_missing: Annotated[bool, typer.Option(
        "--count-missing", metavar="", help="count tasks without a solution as failures in the metrics")] = False,
    judge_url: Annotated[Optional[str], typer.Option(
        "--judge-url", envvar="CUDA_AGENT_JUDGE_URL",
        help="judge through a running `cuda-agent serve` at this URL (its token in $CUDA_AGENT_SERVE_TOKEN) "
             "instead of an in-process pool; the service's judge settings apply")] = None,
    device: DeviceOpt = None, policy: PolicyOpt = None, compile_mode: CompileOpt = None,
    config: ConfigOpt = None, set_: SetOpt = None,
) -> None:
    """Judge every task that has a solution through the worker pool; print the table and CUDA Agent's metrics.

    Every verdict goes to the results database as it arrives: rerun with the same --run to resume.
    One row per (task, candidate) pair; a pair the judge could not judge (its baseline failed, the
    pool broke) is a row too, counted as not correct. Exit 3 when the pool broke.
    """
    from pydantic import ValidationError

    from cuda_agent.bench import BenchUsageError, run_bench
    from cuda_agent.db import DBError
    from cuda_agent.judge import JudgeError
    from cuda_agent.pool import PoolConfig, PoolError
    from cuda_agent.settings import explain
    from cuda_agent.tasks import TaskError

    cfg, reward = build_configs(config, set_, device=device, policy=policy, compile_mode=compile_mode)
    if tasks not in ("suite", "suite:cuda", "suite:cpu"):
        _existing(Path(tasks), "task file or folder")
    _device_or_exit(cfg.device)
    try:
        pool_config = PoolConfig(judge_workers=workers, judges_per_gpu=judges_per_gpu,
                                 compile_workers=compile_workers, time_limit_s=time_limit)
    except ValidationError as exc:
        _fail(str(explain(PoolConfig, exc,
                          "pool settings (--workers, --judges-per-gpu, --compile-workers, --time-limit)")), 2)
    client = None
    errors: tuple[type[Exception], ...] = (TaskError, JudgeError, PoolError, DBError)
    if judge_url:
        from cuda_agent.serve.client import JudgeClient, ServiceError

        try:
            client = JudgeClient.from_env(judge_url)
        except ValueError as exc:
            _fail(str(exc), 2)
        errors += (ServiceError,)
    try:
        result = run_bench(tasks, solutions, cfg, levels=level, out=out, db_path=db, run_name=run,
                           pool_config=pool_config, report=report, count_missing=count_missing, reward=reward,
                           judge=client)
    except BenchUsageError as exc:
        _fail(str(exc), 2)
    except errors as exc:
        _fail(str(exc))
    finally:
        if client is not None:
            client.shutdown(wait=False)
    if result.pool_error:  # the table and files are written; the pairs it left are recorded, to resume
        _fail(f"the pool broke, {result.failed_now} pairs not judged (rerun with --run {result.run} to retry "
              f"them): {result.pool_error}")


@app.command("build")
def build_cmd(
    paths: Annotated[list[Path], typer.Argument(help="candidates: single-file ModelNew modules and/or workspace "
                                                   "folders; a folder holding neither is searched one level down")],
    parallel: Annotated[int, typer.Option("--parallel", "-j", min=1, help="builds run side by side")] = 4,
    jobs: Annotated[Optional[int], typer.Option("--jobs", min=1, help="compiler processes per build "
                                                                      "(default: the cores shared out)")] = None,
    device: DeviceOpt = None, policy: PolicyOpt = None, config: ConfigOpt = None, set_: SetOpt = None,
) -> None:
    """Compile candidates into the judge's build cache ahead of judging, many at once.

    A later `eval` or `bench` with the same settings finds them built. Single files are built from
    their literal load_inline arguments (a call the judge can only learn by running the module is
    left to the judge). Exit 0 even when builds fail: the first line of each failure is listed, and
    the judge reports the whole error in its verdict.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cuda_agent.candidate import Candidate, CandidateError
    from cuda_agent.pool.prebuild import build_ahead

    cfg = build_config(config, set_, device=device, policy=policy)
    candidates = []
    for path in paths:
        if not path.exists():
            _fail(f"{path}: no such file or folder", 2)
        inner = [path] if path.is_file() or (path / "model_new.py").exists() else sorted(
            p for p in path.iterdir() if p.suffix == ".py" or (p / "model_new.py").exists())
        for p in inner:
            try:
                candidates.append(Candidate.from_path(p))
            except CandidateError as exc:
                err.print(f"[yellow]skipped[/yellow] {p}: {exc}")
    if not candidates:
        _fail("no candidates found", 2)
    with Progress(TextColumn("building"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err) as bar:
        task = bar.add_task("build", total=len(candidates))
        results = build_ahead(candidates, cfg, parallel=parallel, jobs=jobs,
                              on_result=lambda _r: bar.advance(task))
    built = sum(r.built for r in results)
    cached = sum(r.cached for r in results)
    failed = sum(len(r.failed) for r in results)
    skipped = sum(1 for r in results if r.skipped and not r.specs)
    for r in [r for r in results if r.failed][:20]:
        err.print(f"[red]failed[/red] {r.origin}: {r.failed[0]}")
    err.print(f"{len(results)} candidates: {built} built, {cached} already cached, {failed} failed, "
              f"{skipped} left to the judge")


@app.command("report")
def report_cmd(
    run_a: Annotated[str, typer.Argument(help="the run to report")],
    run_b: Annotated[Optional[str], typer.Argument(help="a second run, compared side by side with the first")] = None,
    db: Annotated[Optional[Path], typer.Option("--db", help="results database (default as for bench)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="HTML file to write (default: RUN_A[-vs-RUN_B].html)")] = None,
    count_missing: Annotated[bool, typer.Option(
        "--count-missing", metavar="", help="count tasks without a solution as failures in the metrics")] = False,
) -> None:
    """Write one self-contained HTML report of a run (or of two runs, side by side)."""
    from cuda_agent.db import DBError, default_db_path
    from cuda_agent.judge.config import default_cache_dir
    from cuda_agent.report_html import write_report

    db_path = db or default_db_path(default_cache_dir())
    if not db_path.exists():
        _fail(f"{db_path}: no results database (run cuda-agent bench first, or pass --db)", 2)
    runs = [run_a] + ([run_b] if run_b else [])
    target = out or Path("-vs-".join(runs).replace("/", "_") + ".html")
    try:
        write_report(db_path, runs, target, count_missing=count_missing)
    except KeyError as exc:
        _fail(str(exc.args[0]), 2)
    except DBError as exc:
        _fail(str(exc))
    typer.echo(str(target))


@app.command("runs")
def runs_cmd(db: Annotated[Optional[Path], typer.Option("--db", help="results database (default as for bench)")] = None) -> None:
    """List the runs in the results database, newest first."""
    from cuda_agent.db import ResultsDB, default_db_path
    from cuda_agent.judge.config import default_cache_dir

    db_path = db or default_db_path(default_cache_dir())
    if not db_path.exists():
        _fail(f"{db_path}: no results database", 2)
    with ResultsDB(db_path) as rdb:
        for info, count, failed in rdb.run_counts():
            typer.echo(f"{info.name}\t{info.device}\t{count} verdicts, {failed} not judged\t{info.spec}")


@app.command("suite")
def suite_cmd(device: DeviceOpt = None) -> None:
    """List the bundled tasks and their solutions with their paths (the main job's suite), one
    line each: name, level, task file, solution (or '-'). Try one with `cuda-agent eval --task T
    --solution S`."""
    from cuda_agent.house import suite_rows
    from cuda_agent.judge.config import default_device

    for name, level, task, solution in suite_rows(device or default_device()):
        typer.echo(f"{name}\t{level if level is not None else '-'}\t{task}\t{solution or '-'}")


@app.command("cache")
def cache_cmd(clear: Annotated[Optional[list[str]], typer.Option(
        "--clear", help="remove a part: ext, baselines, verdicts, pch, results, or all (every part but the "
                        "results database); repeat for several")] = None) -> None:
    """Show what the judge keeps, part by part, with its size and path (every part lives in the
    cache folder, $CUDA_AGENT_CACHE); each part is rebuilt on demand once cleared. Clear nothing
    while a judge is running."""
    from cuda_agent.house import CLEARED_BY_ALL, cache_parts, human_bytes

    parts = {p.name: p for p in cache_parts()}
    names = []
    for name in clear or []:
        if name == "all":
            names += [n for n in CLEARED_BY_ALL if n in parts and n not in names]
        elif name in parts:
            names.append(name)
        else:
            _fail(f"--clear {name}: no such part (choose from {', '.join(parts)}, all)", 2)
    for name in names:
        size = parts[name].size_bytes()
        parts[name].clear()
        typer.echo(f"cleared {name} ({human_bytes(size)}) at {parts[name].path}")
    if not names:
        total = 0
        for p in parts.values():
            size = p.size_bytes()
            total += size
            typer.echo(f"{p.name:<10} {human_bytes(size):>10}  {p.path}  ({p.what})")
        typer.echo(f"{'total':<10} {human_bytes(total):>10}")


@app.command("doctor")
def doctor_cmd() -> None:
    """Check this machine for the judge: Python, torch and the GPU, the C++ compiler with OpenMP,
    nvcc against torch's CUDA, CUPTI, compute-sanitizer and ncu, the sandbox (seccomp, uids,
    namespaces, Landlock) and CUDA IPC between processes. One line per check: ok, warn (works with
    less) or fail; exit 3 if any fails."""
    from cuda_agent.doctor import exit_code, run_checks

    checks = run_checks()
    for c in checks:
        typer.echo(f"{c.status:<5} {c.name}: {c.detail}")
    raise typer.Exit(exit_code(checks))


from cuda_agent.agent.cli import register as _register_agent  # noqa: E402  (solve, run)
from cuda_agent.synth.cli import synth_app  # noqa: E402  (synth and its audits, with the synth package)
from cuda_agent.hardware.cli import sol_cmd  # noqa: E402  (speed-of-light per task)
from cuda_agent.train.cli import register as _register_train  # noqa: E402  (train: the RL stages)

_register_agent(app)
_register_train(app)
app.add_typer(synth_app, name="synth")
app.command("sol")(sol_cmd)
from cuda_agent.serve.cli import serve_cmd  # noqa: E402  (defined with the serve package)
from cuda_agent.fidelity.cli import fidelity_cmd  # noqa: E402  (the leaderboard corpus, judged)

app.command("serve")(serve_cmd)
app.command("fidelity")(fidelity_cmd)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

"""The `cuda-agent synth` group (registered by cuda_agent.cli): synthesis itself (the group's own
options), `synth audit` of an export, `synth decontam` of the decontamination filter."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cuda_agent.console import make_console, print_error
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

err = make_console(stderr=True)

synth_app = typer.Typer(add_completion=False, rich_markup_mode=None)


class _RichProgress:
    def __init__(self, console: Console):
        self.p = Progress(TextColumn("synth"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                          TimeElapsedColumn(), console=console, transient=False)
        self.task = None

    def start(self, total: int, done: int) -> None:
        self.p.start()
        self.task = self.p.add_task("synth", total=total, completed=min(done, total), info="")

    def update(self, accepted: int, candidates: int, last) -> None:
        why = last.rejection.filter if last.rejection else "accepted"
        total = self.p.tasks[0].total or accepted
        self.p.update(self.task, completed=min(accepted, total), info=f"{candidates} candidates, last: {why}")
        if not self.p.console.is_terminal:  # a log gets no bar (rich draws none there): one line per item
            what = "accepted" if last.accepted else f"rejected by {why}"
            if last.judge is not None and last.judge.ok:
                what += " (judge's reference check passed)"
            self.p.console.print(f"[{accepted}/{total} accepted, {candidates} candidates] "
                                 f"{last.index} {last.name or '(unnamed)'}: {what}", markup=False, highlight=False)

    def stop(self) -> None:
        self.p.stop()


def print_report(report, console: Console) -> None:
    from .filters import FILTERS

    # One column of candidate counts: those each filter removed, then those every filter passed.
    table = Table(title=f"{report.candidates} candidates: removed by each filter, then accepted")
    table.add_column("filter")
    table.add_column("candidates", justify="right")
    table.add_column("what it removes")
    for name, count in report.rejected_by.items():
        table.add_row(name, str(count), FILTERS.get(name, ""))
    table.add_row("[bold]accepted[/bold]", f"[bold]{report.accepted}[/bold]", "exported")
    if report.accepted_not_exported:
        table.add_row("accepted, not exported", str(report.accepted_not_exported),
                      "passed the filters beyond --n (or awaiting the judge's check)")
    table.add_row("[bold]candidates[/bold]", f"[bold]{report.candidates}[/bold]", "the rows above add up to this")
    console.print(table)
    console.print(f"torch.compile check: {'on' if report.compile_check else 'off (--no-compile)'}; shortcut checks: "
                  + (f"on, {report.n_input_sets} input sets" if report.shortcut_checks else "off"))
    console.print(f"export criterion: {'on' if report.criterion else 'off'}; composer hazard guards: "
                  f"{'on' if report.hazard_guards else 'off'} ({len(report.refused_seeds)} seed ranks left out); "
                  f"rejected for non-finite, ill-conditioned or criterion reasons: {sum(report.hazard_rejections.values())} "
                  f"({report.hazard_share:.1%} of candidates)")
    d = report.diversity
    if d.get("tasks"):
        console.print(f"diversity: {d['distinct_ops']} distinct ops in {d['distinct_chains']} distinct chains over "
                      f"{d['tasks']} tasks; ops per task {d['ops_per_task']}; most used op {d['top_op_share']:.0%} "
                      f"of uses; normalised op entropy {d['op_entropy_normalised']:.2f}"
                      + (f"; nearest benchmark similarity max {d['benchmark_similarity_max']:.2f}"
                         if d.get("benchmark_similarity_max") is not None else ""))
    console.print(f"{report.tasks_per_hour:.0f} tasks/hour, {report.candidates_per_hour:.0f} candidates/hour "
                  f"this run ({report.wall_s:.1f} s); exported {report.exported} tasks")
    if report.judge_checked:
        filter_s = sum(p["wall_s"] for p in report.phases if p["phase"] == "filter")
        console.print(f"judge's reference checks: {report.judge_checked} tasks in {report.judge_s:.1f} s "
                      f"(generating and filtering: {filter_s:.1f} s)")


@synth_app.callback(invoke_without_command=True)
def synth_cmd(
    ctx: typer.Context,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="output folder: candidates log, catalog, tasks.parquet/.jsonl (required to synthesize)")] = None,
    n: Annotated[int, typer.Option("--n", help="accepted tasks wanted")] = 6000,
    workers: Annotated[Optional[int], typer.Option("--workers", help="parallel isolated workers (default: cores / 2)")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cuda or cpu (default: cuda when available)")] = None,
    benchmark_dir: Annotated[Optional[Path], typer.Option(
        "--benchmark-dir", help="decontaminate against the tasks under this folder (e.g. a KernelBench checkout)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="base seed of the candidate stream")] = 0,
    min_ms: Annotated[Optional[float], typer.Option("--min-ms", help="shortest eager runtime kept (default 1)")] = None,
    max_ms: Annotated[Optional[float], typer.Option("--max-ms", help="longest eager runtime kept (default 100)")] = None,
    compile_check: Annotated[Optional[bool], typer.Option(
        "--compile/--no-compile", metavar="", help="check torch.compile against eager (default: on, on every device)")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="seconds for all checks of one task")] = None,
    composer: Annotated[str, typer.Option("--composer", help="programmatic or llm")] = "programmatic",
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="seed catalog file (default OUT/catalog.jsonl)")] = None,
    llm_base_url: Annotated[Optional[str], typer.Option("--llm-base-url", help="OpenAI-compatible endpoint")] = None,
    llm_model: Annotated[Optional[str], typer.Option("--llm-model", help="model name at that endpoint")] = None,
    max_candidates: Annotated[Optional[int], typer.Option("--max-candidates", help="stop after this many candidates")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="seconds: start no new candidate after this, export what was accepted "
                             "(rerun with the same --out to go on)")] = None,
    judge_check: Annotated[Optional[bool], typer.Option(
        "--judge-check/--no-judge-check", metavar="", help="hold every accepted task to the judge's reference checks "
                                               "(its reference reproduced in the judge's isolated process) and "
                                               "export only those that pass")] = None,
    judge_parallel: Annotated[Optional[int], typer.Option("--judge-parallel", help="judge processes for --judge-check")] = None,
    judge_overlap: Annotated[Optional[bool], typer.Option(
        "--judge-overlap/--no-judge-overlap", metavar="", help="with --judge-check: judge each task as the filters "
                                                 "accept it, beside the filter workers (default), or after them")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="SynthConfig fields from a TOML or JSON file")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "-c", "--set", help="override one SynthConfig field, nested ones by their path: -c n=100, "
                            "-c filters.max_ms=50, -c decontam.ops_threshold=0.95 (flags win)")] = None,
) -> None:
    """Synthesize fused-operator tasks: crawl seed ops, compose, filter in isolated workers, export.

    Resumable: rerun the same command to continue. Prints how many candidates each filter removed.
    `cuda-agent synth audit` and `cuda-agent synth decontam` check an export and the decontamination.
    """
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        err.print("[red]error:[/red] Missing option '--out' (the output folder of the synthesis)")
        raise typer.Exit(2)
    from cuda_agent.judge.config import default_device
    from cuda_agent.settings import SettingsError, apply_overrides, read_file, validate

    from .filters import worker_layout
    from .pipeline import SynthConfig, run_synth

    if out.exists() and not out.is_dir():
        err.print(f"[red]error:[/red] --out {escape(str(out))}: a file is there; --out names a folder (new, or an "
                  "earlier run's to continue it)")
        raise typer.Exit(2)
    try:
        values = apply_overrides(read_file(config, section="synth"), set_ or [], SynthConfig)
    except SettingsError as exc:
        print_error(err, str(exc))
        raise typer.Exit(2)
    dev = device or values.get("filters", {}).get("device") or default_device()
    filters = dict(values.get("filters", {}), device=dev)
    for key, val in (("min_ms", min_ms), ("max_ms", max_ms), ("compile", compile_check), ("timeout_s", timeout)):
        if val is not None:
            filters[key] = val
    n_workers, threads = worker_layout(workers or values.get("workers"))
    filters.setdefault("threads_per_worker", threads)
    compose = dict(values.get("compose", {}))
    compose.setdefault("profile", dev)
    llm = dict(values.get("llm") or {})
    if llm_base_url:
        llm["base_url"] = llm_base_url
    if llm_model:
        llm["model"] = llm_model
    values.update(out=out, n=n, seed=seed, workers=n_workers, filters=filters, compose=compose, composer=composer,
                  llm=llm or None)
    for key, val in (("benchmark_dir", benchmark_dir), ("catalog", catalog), ("max_candidates", max_candidates),
                     ("time_limit_s", time_limit), ("judge_check", judge_check), ("judge_parallel", judge_parallel),
                     ("judge_overlap", judge_overlap)):
        if val is not None:
            values[key] = val
    try:
        cfg = validate(SynthConfig, values, "synth settings")
    except SettingsError as exc:
        print_error(err, str(exc))
        raise typer.Exit(2)
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available():
            err.print("[red]error:[/red] --device cuda but CUDA is not available (use --device cpu)")
            raise typer.Exit(3)
    try:
        report = run_synth(cfg, _RichProgress(err))
    except (ValueError, OSError, RuntimeError) as exc:
        print_error(err, str(exc))
        raise typer.Exit(3)
    print_report(report, Console())


@synth_app.command("audit")
def audit_cmd(
    tasks: Annotated[Path, typer.Argument(help="an export's tasks.jsonl")],
    sets: Annotated[int, typer.Option("--sets", min=1, help="fresh input sets per task")] = 30,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda")] = "cpu",
    seed: Annotated[int, typer.Option("--seed", help="input set k is drawn under seed + k")] = 90_000,
    batch: Annotated[Optional[int], typer.Option(
        "--batch", min=1, help="probe every task at BATCH = this instead of its exported size (e.g. 16 on a CPU)")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        "--time-limit", help="seconds: start no new task after this; the tasks are then taken in a random order "
                             "(seeded by --seed), so the audited part is a random sample of the export")] = None,
    checks: Annotated[str, typer.Option(
        "--checks", help="shortcuts (the filters' shortcut checks), criterion (the export criterion) or both")] = "both",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None,
) -> None:
    """Audit an export at the judge's tolerance, on input sets the filters never saw.

    Every task of TASKS is rebuilt and probed with the synth worker's shortcut checks and held to the
    export criterion, on --sets fresh input sets drawn under other seeds than the filters'. A task
    that fails here passed the filters with a defect they missed. Tasks run in this process: audit
    only exports you made. One line per task on stderr, the summary on stdout. Exit 0 whatever was
    found, 2 on a usage error.
    """
    import json

    from .audit import audit, summary

    if not tasks.is_file():
        print_error(err, f"{tasks}: no such file")
        raise typer.Exit(2)
    if checks not in ("shortcuts", "criterion", "both"):
        print_error(err, f"--checks {checks}: choose shortcuts, criterion or both")
        raise typer.Exit(2)
    if device not in ("cpu", "cuda"):
        print_error(err, f"--device {device}: choose cpu or cuda")
        raise typer.Exit(2)
    result = audit(tasks, sets, device, seed, batch, time_limit, checks)
    result["batch"] = batch
    typer.echo(summary(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))


@synth_app.command("decontam")
def decontam_cmd(
    bench: Annotated[Path, typer.Option("--bench", help="benchmark folder (KernelBench layout, or flat as the "
                                                        "leaderboard's docs/assets/problems)")],
    level: Annotated[Optional[list[int]], typer.Option(
        "--level", help="levels kept (file names lN_*, or folders levelN; repeatable; default 1, 2 and 3)")] = None,
    all_levels: Annotated[bool, typer.Option("--all-levels", metavar="", help="every task of the folder")] = False,
    edit: Annotated[Optional[list[str]], typer.Option(
        "--edit", help="edit kinds (repeatable; default all): rename, resize, reorder, torch_to_F, noop, alias, "
                       "subclass, helper, const_noop, silu, all")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="first N tasks only")] = None,
    no_trace: Annotated[bool, typer.Option("--no-trace", metavar="", help="static measures only (no traced "
                                                                          "operators)")] = False,
    distinct: Annotated[Optional[Path], typer.Option("--distinct", help="a tasks.jsonl of more distinct tasks "
                                                                        "(a synth export)")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None,
) -> None:
    """How many near-copies of benchmark tasks the decontamination filter catches.

    Applies meaning-preserving edits to every task of --bench, one kind at a time, and asks the
    synth pipeline's decontamination whether each edited task is a copy (the candidate traced in a
    child process as the synth worker traces it); then 8 near-copies written by hand, and the false
    positives on distinct tasks. Exit 0 with the table, 2 on a usage error.
    """
    import json

    from .edit_check import measure, render
    from .edits import EDITS

    if not bench.is_dir():
        print_error(err, f"--bench {bench}: no such folder")
        raise typer.Exit(2)
    unknown = sorted(set(edit or []) - set(EDITS))
    if unknown:
        print_error(err, f"--edit {', '.join(unknown)}: no such edit (choose from {', '.join(EDITS)})")
        raise typer.Exit(2)
    if distinct is not None and not distinct.is_file():
        print_error(err, f"--distinct {distinct}: no such file")
        raise typer.Exit(2)
    levels = None if all_levels else (level or [1, 2, 3])
    result = measure(bench, levels, edit or list(EDITS), limit, trace=not no_trace, distinct=distinct)
    typer.echo(render(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))

"""`cuda-agent`: judge candidates, benchmark task suites.

Exit codes: 0 a verdict (or table) was produced, even for failing candidates; 2 usage error;
3 the judge could not work (no such device, unreadable task, broken installation).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Agentic RL for CUDA kernels: an honest, fast judge for candidate kernels.")
err = Console(stderr=True)
EXIT_JUDGE = 3

DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cuda or cpu (default: cuda when available, else the CPU backend)")]
PolicyOpt = Annotated[Optional[str], typer.Option(
    "--policy", help="strict (CUDA Agent skill: no PyTorch compute in forward) or lenient (torch glue allowed)")]
CompileOpt = Annotated[Optional[str], typer.Option(
    "--compile-mode", help="torch.compile mode of the compiled baseline: default, reduce-overhead, "
                           "max-autotune, max-autotune-no-cudagraphs, or none to skip it")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", help="judge settings from a TOML or JSON file (fields of JudgeConfig)")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "-c", "--set", help="override one JudgeConfig field, e.g. -c atol=1e-3 -c n_timed=50")]


def _fail(message: str, code: int = EXIT_JUDGE) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def build_config(config: Optional[Path], sets: Optional[list[str]], **flags):
    from pydantic import ValidationError

    from cuda_agent.judge import JudgeConfig

    values: dict = {}
    if config is not None:
        try:
            text = config.read_text()
            values = tomllib.loads(text) if config.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            _fail(f"{config}: {exc}", 2)
        values = values.get("judge", values)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep:
            _fail(f"-c expects key=value, got {item!r}", 2)
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        return JudgeConfig(**values)
    except ValidationError as exc:
        _fail(f"invalid judge settings:\n{exc}", 2)


@app.command("eval")
def eval_cmd(
    task: Annotated[Path, typer.Option("--task", help="reference module in KernelBench format (Model, get_inputs, get_init_inputs)")],
    solution: Annotated[Path, typer.Option("--solution", help="a single-file ModelNew module (load_inline) or a CUDA Agent workspace folder")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the verdict summary)")] = False,
    full: Annotated[bool, typer.Option("--full", help="with --json: the whole verdict, per-call records included")] = False,
    device: DeviceOpt = None, policy: PolicyOpt = None, compile_mode: CompileOpt = None,
    config: ConfigOpt = None, set_: SetOpt = None,
) -> None:
    """Judge one candidate: compile, verify on fresh inputs, time against eager and torch.compile, reward.

    Exit 0 whenever a verdict was produced, including for failing candidates.
    """
    from cuda_agent.candidate import Candidate, CandidateError
    from cuda_agent.judge import Judge, JudgeError
    from cuda_agent.tasks import TaskError, load_task_file

    cfg = build_config(config, set_, device=device, policy=policy, compile_mode=compile_mode)
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
    if as_json:
        out = verdict.model_dump(mode="json") | verdict.summary() if full else verdict.summary()
        sys.stdout.write(json.dumps(out, indent=None if not full else 1) + "\n")
    else:
        from cuda_agent.report import print_verdict

        print_verdict(verdict)


@app.command("bench")
def bench_cmd(
    tasks: Annotated[str, typer.Argument(help="'suite' (bundled), a KernelBench-style folder, a task .py, "
                                              "or an Ops-6K .jsonl/.parquet file")] = "suite",
    solutions: Annotated[Optional[Path], typer.Option(
        "--solutions", help="folder of solutions named by task (NAME.py or NAME/ workspace); "
                            "default for the suite: its bundled solutions")] = None,
    level: Annotated[Optional[list[int]], typer.Option("--level", help="only these levels")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="write all verdicts as JSON lines here")] = None,
    device: DeviceOpt = None, policy: PolicyOpt = None, compile_mode: CompileOpt = None,
    config: ConfigOpt = None, set_: SetOpt = None,
) -> None:
    """Judge every task that has a solution and print the table (speed-ups, rewards, pass rates)."""
    from cuda_agent.bench import run_bench

    cfg = build_config(config, set_, device=device, policy=policy, compile_mode=compile_mode)
    from cuda_agent.judge import JudgeError
    from cuda_agent.tasks import TaskError

    try:
        run_bench(tasks, solutions, cfg, levels=level, out=out)
    except (TaskError, JudgeError, FileNotFoundError) as exc:
        _fail(str(exc))


from cuda_agent.agent.cli import register as _register_agent  # noqa: E402  (solve, run)
from cuda_agent.synth.cli import synth_cmd  # noqa: E402  (defined with the synth package)

_register_agent(app)
app.command("synth")(synth_cmd)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

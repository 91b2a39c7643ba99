"""`cuda-agent solve` and `cuda-agent run`: the agent on one module or on a task set.

Registered on the main app by `cuda_agent.cli`; heavy imports stay inside the commands.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer
from cuda_agent.console import make_console
from rich.markup import escape

from cuda_agent.report import fmt_x

err = make_console(stderr=True)
out = make_console()
EXIT_CANNOT_WORK = 3  # as for every command: the judge, the device or the model server cannot work

SERVER_HELP = """

Point it at any OpenAI-compatible server with --base-url, --model and --api-key, or with the
environment variables OPENAI_BASE_URL, CUDA_AGENT_MODEL and OPENAI_API_KEY (flags win). Without a
model name the first model the server lists is used; local servers accept any key.

vLLM: vllm serve Qwen/Qwen3-32B --enable-auto-tool-choice --tool-call-parser hermes, then
--base-url http://localhost:8000/v1

SGLang: python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tool-call-parser qwen25,
then --base-url http://localhost:30000/v1

Hosted APIs: their base URL, a model name and OPENAI_API_KEY.

Tool calling is native when the server supports it; --tool-mode text describes the tools in the
prompt instead (auto switches to it when the server refuses tools)."""

# model
BaseUrlOpt = Annotated[Optional[str], typer.Option("--base-url", help="OpenAI-compatible endpoint, e.g. "
                                                   "http://localhost:8000/v1 (env OPENAI_BASE_URL)")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="model name (env CUDA_AGENT_MODEL; default: "
                                                 "the first model the server lists)")]
KeyOpt = Annotated[Optional[str], typer.Option("--api-key", help="API key (env OPENAI_API_KEY; any value for "
                                               "local servers)")]
ToolModeOpt = Annotated[Optional[str], typer.Option("--tool-mode", help="auto, native (server tool calling) or "
                                                    "text (tools described in the prompt)")]
TemperatureOpt = Annotated[Optional[float], typer.Option("--temperature", help="sampling temperature")]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", help="longest reply in tokens (default 8192)")]
# agent
TurnsOpt = Annotated[Optional[int], typer.Option("--max-turns", help="model calls per task (default 150)")]
ContextOpt = Annotated[Optional[int], typer.Option("--context-tokens", help="context budget in tokens "
                                                   "(default 128000)")]
AgentConfigOpt = Annotated[Optional[Path], typer.Option(
    "--agent-config", help="model and agent settings from a TOML or JSON file: sections model (ModelConfig) and "
                           "agent (AgentConfig); flags override it")]
# judge (as for `cuda-agent eval`)
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cuda or cpu (default: cuda when available, else the CPU backend with C++ kernels)")]
PolicyOpt = Annotated[Optional[str], typer.Option("--policy", help="strict (default) or lenient")]
CompileOpt = Annotated[Optional[str], typer.Option("--compile-mode", help="torch.compile mode of the baseline, "
                                                   "or none to skip it")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="judge settings from a TOML or JSON file")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "-c", "--set", help="override one setting: a JudgeConfig field (-c n_timed=50, or -c judge.n_timed=50), "
                        "an AgentConfig field (-c agent.max_turns=20, -c agent.tools.observation_chars=4000) or a "
                        "ModelConfig field (-c model.temperature=0.2)")]
JudgeUrlOpt = Annotated[Optional[str], typer.Option(
    "--judge-url", envvar="CUDA_AGENT_JUDGE_URL",
    help="judge through a running `cuda-agent serve` at this URL (its token in $CUDA_AGENT_SERVE_TOKEN) instead of "
         "a judge in this process; the service's judge settings and GPUs apply, and this machine needs none")]
RetriesOpt = Annotated[int, typer.Option("--retries", min=0, help="run a task again at once after a retryable "
                                         "error (model server, judge), up to this many times")]


def _setup(base_url, model, api_key, tool_mode, temperature, max_tokens, max_turns, context_tokens, agent_file,
           device, policy, compile_mode, config, set_, judge_url=None):
    """Model client, judge gate and agent settings: flags over -c over the settings file over the
    environment; a mistake in any of them is a usage error (exit 2). With `judge_url` the gate is
    the service there (`rollout.remote.RemoteEvaluator`), whose own judge settings apply: giving judge settings
    here too is a usage error rather than settings silently ignored."""
    from pydantic import ValidationError

    from cuda_agent.judge import JudgeConfig
    from cuda_agent.settings import SettingsError, apply_overrides, explain, load, read_file, split_overrides

    from cuda_agent.llm import ChatClient, ModelConfig, ProviderError
    from cuda_agent.rollout.evaluator import LocalEvaluator

    from .loop import AgentConfig

    routed = split_overrides(set_, ("judge", "agent", "model"), default="judge")
    try:
        judge_config = load(JudgeConfig, config, routed["judge"], section="judge", what="judge settings",
                            flags=dict(device=device, policy=policy, compile_mode=compile_mode))
        values = read_file(agent_file)

        def merged(section: str, config_model, **flags) -> dict:
            part = values.get(section, {})
            if not isinstance(part, dict):
                raise SettingsError(f"{agent_file}: {section} must be a table of {config_model.__name__} fields")
            part = apply_overrides(part, routed[section], config_model)
            return {**part, **{k: v for k, v in flags.items() if v is not None}}

        model_values = merged("model", ModelConfig, base_url=base_url, model=model, api_key=api_key,
                              tool_mode=tool_mode, temperature=temperature, max_tokens=max_tokens)
        try:
            model_config = ModelConfig.from_env(**model_values)
        except ValidationError as exc:
            raise explain(ModelConfig, exc, "model settings") from None
        agent_config = load(AgentConfig, flags=merged("agent", AgentConfig, max_turns=max_turns,
                                                      context_tokens=context_tokens), what="agent settings")
    except SettingsError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2)
    if judge_url:
        given = [flag for flag, value in (("--device", device), ("--policy", policy), ("--compile-mode", compile_mode),
                                          ("--config", config)) if value is not None]
        given += [f"-c {item}" for item in routed["judge"]]
        if given:
            _fail(f"--judge-url judges with the service's settings; leave out {', '.join(given)}", 2)
    else:
        _device_or_exit(judge_config.device)
    try:
        client = ChatClient(model_config)
    except ProviderError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2)
    if not judge_url:
        return client, LocalEvaluator(judge_config), agent_config
    from cuda_agent.judge import JudgeError

    from cuda_agent.rollout.remote import RemoteEvaluator

    try:
        return client, RemoteEvaluator.connect(judge_url), agent_config
    except ValueError as exc:
        _fail(str(exc), 2)
    except JudgeError as exc:
        _fail(str(exc), EXIT_CANNOT_WORK)


def _fail(message: str, code: int) -> None:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def _device_or_exit(device: str) -> None:
    """`--device cuda` on a machine without a usable GPU: the line `eval` prints, exit 3, before a
    workspace is made or a model turn is spent (the judge would refuse at its first use)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail("device 'cuda' requested but CUDA is not available (use --device cpu)", EXIT_CANNOT_WORK)


def _check_server(client) -> None:
    """One request to the model server before any task starts (`ChatClient.check`): a server that is
    down, refuses the key or lacks the model ends the command in seconds with one line, exit 3.
    `-c model.check=false` skips it (a server whose model list is incomplete)."""
    from cuda_agent.llm import ProviderError

    if not client.config.check:  # -c model.check=false
        return
    try:
        client.check()
    except ProviderError as exc:
        _fail(str(exc), EXIT_CANNOT_WORK)


def _task_or_exit(path: Path):
    """The task file: a path that does not exist is a usage error (2); a file that is not a task is
    one the judge cannot work on (3), as for `eval`."""
    from cuda_agent.tasks import TaskError, load_task_file

    if not path.is_file():
        _fail(f"{path}: no such file" if not path.exists() else f"{path}: not a file", 2)
    try:
        return load_task_file(path)
    except TaskError as exc:
        _fail(str(exc), EXIT_CANNOT_WORK)


def _line(s: dict) -> str:
    """One task's summary as rich markup: every text from the run is escaped (a message such as
    "[model: ...]" would otherwise be read as a markup tag and vanish)."""
    best = s.get("best")
    what = "no correct candidate" if not best else (
        f"reward {'-' if best.get('reward') is None else format(best['reward'], 'g')}, {fmt_x(best['speedup_vs_eager'])} vs eager, {fmt_x(best['speedup_vs_compile'])} "
        "vs torch.compile")
    resumed = " (finished earlier)" if s.get("resumed") else ""
    line = f"{escape(str(s['task']))}: {s['termination']} after {s.get('turns', '?')} turns{resumed}; {what}"
    if s["termination"] == "error":
        error = s.get("error") if isinstance(s.get("error"), dict) else {}
        kind = f"{error['kind']} error" if error.get("kind") else "error"
        retry = "" if "retryable" not in error else (
            "; a rerun starts it again" if error["retryable"] else "; a rerun keeps this result")
        reason = (s.get("message") or "").strip()
        reason = reason if len(reason) <= 2000 else "..." + reason[-2000:]
        line += f"\n  [red]{kind}[/red]{retry}: {escape(reason)}"
    return line


def solve_cmd(
    module: Annotated[Path, typer.Argument(help="your module in KernelBench format (Model, get_inputs, get_init_inputs)")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="output folder (default: agent_runs/<module name>)")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", metavar="", help="start over even if OUT holds a finished run")] = False,
    base_url: BaseUrlOpt = None, model: ModelOpt = None, api_key: KeyOpt = None, tool_mode: ToolModeOpt = None,
    temperature: TemperatureOpt = None, max_tokens: MaxTokensOpt = None, max_turns: TurnsOpt = None,
    context_tokens: ContextOpt = None, agent_config: AgentConfigOpt = None, device: DeviceOpt = None,
    policy: PolicyOpt = None,
    compile_mode: CompileOpt = None, config: ConfigOpt = None, set_: SetOpt = None, retries: RetriesOpt = 0,
    judge_url: JudgeUrlOpt = None,
) -> None:
    """Let a model turn your PyTorch module into verified, faster kernels.

    Shows the run as it goes (turn, tool, verdict, best speed-up so far, tokens) on stderr: redrawn
    in place on a terminal, one line per tool call otherwise. Writes OUT/best (the best workspace
    the judge found correct), OUT/result.json (with the speed-ups vs eager and torch.compile),
    OUT/workspace and OUT/trajectory.jsonl. A rerun skips a finished task. Exit 0 when the run
    ended (submitted or cut by a limit), 2 on usage errors, 3 when it ended in an error (the model
    server, the judge) or could not start (no GPU for --device cuda, the model server down)."""
    from cuda_agent.judge import JudgeError

    from .live import LiveView
    from .runner import finished, solve_task

    task = _task_or_exit(module)
    client, gate, settings = _setup(base_url, model, api_key, tool_mode, temperature, max_tokens, max_turns,
                                    context_tokens, agent_config, device, policy, compile_mode, config, set_, judge_url)
    folder = out_dir or Path("agent_runs") / module.stem
    earlier = None if fresh else finished(folder, task)
    try:
        if earlier is not None:  # a finished task: nothing to run, no server to ask
            summary = {**earlier, "resumed": True}
        else:
            _check_server(client)
            with LiveView(err) as view:
                summary = solve_task(task, folder, client, gate, settings, resume=False, retries=retries,
                                     on_progress=view.update)
    except JudgeError as exc:
        _fail(str(exc), EXIT_CANNOT_WORK)
    finally:
        gate.close()
    out.print(_line(summary), soft_wrap=True)  # a log keeps the line whole
    if summary.get("best_workspace"):
        out.print(f"best verified workspace: {escape(str(summary['best_workspace']))}")
    out.print(f"summary: {escape(str(folder / 'result.json'))}")
    if summary["termination"] == "error":
        raise typer.Exit(EXIT_CANNOT_WORK)


def run_cmd(
    tasks: Annotated[str, typer.Argument(help="'suite' (bundled), a KernelBench-style folder, a task .py, "
                                              "or an Ops-6K .jsonl/.parquet file")] = "suite",
    out_dir: Annotated[Path, typer.Option("--out", help="output folder: one subfolder per task, results.jsonl")]
    = Path("agent_runs/run"),
    concurrency: Annotated[int, typer.Option("--concurrency", "-j", min=1, help="tasks in flight at once "
                                             "(model calls overlap; judge calls take turns)")] = 1,
    level: Annotated[Optional[list[int]], typer.Option("--level", help="only these levels")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="only the first N tasks")] = None,
    base_url: BaseUrlOpt = None, model: ModelOpt = None, api_key: KeyOpt = None, tool_mode: ToolModeOpt = None,
    temperature: TemperatureOpt = None, max_tokens: MaxTokensOpt = None, max_turns: TurnsOpt = None,
    context_tokens: ContextOpt = None, agent_config: AgentConfigOpt = None, device: DeviceOpt = None,
    policy: PolicyOpt = None,
    compile_mode: CompileOpt = None, config: ConfigOpt = None, set_: SetOpt = None, retries: RetriesOpt = 0,
    judge_url: JudgeUrlOpt = None,
) -> None:
    """Run the agent on many tasks with bounded concurrency and a progress bar.

    Each task gets OUT/<task>/ (as for solve); OUT/results.jsonl collects the summaries. A rerun
    skips finished tasks. Exit 0 when at least one task ran to its end, 2 on usage errors, 3 when
    every task ended in an error or none could start (the model server down, no GPU for --device
    cuda)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cuda_agent.metrics import geomean
    from cuda_agent.tasks import TaskError, load_tasks

    from .runner import finished, run_tasks, task_folder

    client, gate, settings = _setup(base_url, model, api_key, tool_mode, temperature, max_tokens, max_turns,
                                    context_tokens, agent_config, device, policy, compile_mode, config, set_, judge_url)
    spec = f"suite:{gate.device}" if tasks in ("suite", "suite:cuda", "suite:cpu") else tasks
    try:
        todo = load_tasks(spec, level)
    except TaskError as exc:
        _fail(str(exc), 2 if not Path(tasks).exists() and tasks not in ("suite", "suite:cuda", "suite:cpu")
              else EXIT_CANNOT_WORK)
    if level:
        todo = [t for t in todo if t.level in set(level)]
    todo = todo[:limit] if limit else todo
    if any(finished(out_dir / task_folder(t), t) is None for t in todo):  # all finished: no server needed
        _check_server(client)
    out.print(f"{len(todo)} tasks, {concurrency} at a time, judged on {gate.device}; output in "
              f"{escape(str(out_dir))}")
    with Progress(TextColumn("agent"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out) as bar:
        progress = bar.add_task("agent", total=len(todo))

        def done(summary: dict) -> None:
            bar.console.print(_line(summary), soft_wrap=True)
            bar.advance(progress)

        try:
            summaries = run_tasks(todo, out_dir, client, gate, settings, concurrency=concurrency, on_done=done,
                                  retries=retries)
        finally:
            gate.close()
    solved = [s for s in summaries if s.get("best")]
    ends: dict[str, int] = {}
    for s in summaries:
        ends[s["termination"]] = ends.get(s["termination"], 0) + 1
    out.print(f"correct candidate for {len(solved)}/{len(summaries)} tasks; runs ended: "
              + ", ".join(f"{k} {v}" for k, v in sorted(ends.items())))
    ge = geomean([s["best"]["speedup_vs_eager"] for s in solved if s["best"]["speedup_vs_eager"]])
    gc = geomean([s["best"]["speedup_vs_compile"] for s in solved if s["best"]["speedup_vs_compile"]])
    out.print(f"geomean speed-up over those: {fmt_x(ge)} vs eager, {fmt_x(gc)} vs torch.compile; "
              f"summaries in {escape(str(out_dir / 'results.jsonl'))}")
    if summaries and all(s["termination"] == "error" for s in summaries):
        _fail(f"every task ended in an error ({len(summaries)} of {len(summaries)}); the reasons are above "
              "and in each task's result.json", EXIT_CANNOT_WORK)


def _help(doc: str) -> str:
    """Paragraphs as single lines: the terminal rewraps them."""
    paragraphs = inspect.cleandoc(doc + SERVER_HELP).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def register(app: typer.Typer) -> None:
    app.command("solve", help=_help(solve_cmd.__doc__))(solve_cmd)
    app.command("run", help=_help(run_cmd.__doc__))(run_cmd)


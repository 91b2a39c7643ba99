"""`cuda-agent train ...`: the four stages on one GPU, data and launch configs for verl clusters.

Exit codes: 0 the stage ran (or resumed to its end); 2 a usage error (bad settings, missing
optional dependency, inputs that cannot start the stage); 3 the judge could not work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from cuda_agent.console import make_console, print_error

err = make_console(stderr=True)
out = make_console()

train_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, help=(
    "Train a policy with CUDA Agent's four stages: warmup (single-turn PPO), rft (rejection fine-tuning), "
    "critic (value pre-training), ppo (multi-turn agentic PPO with GAE). Each reads one settings file "
    "([train] table, the judge's under [judge]) and writes OUT/: episodes/, metrics.jsonl, ckpt/, final/. "
    "Rerun the same command to resume after the last checkpoint. Memory: -c precision=bf16 (default on CUDA), "
    "-c gradient_checkpointing=true, -c critic_mode=shared, -c lora.r=16; advantages: -c ppo.estimator=gae|grpo|rloo. "
    "`prepare` and `verl-config` make the data and launch configs of the verl cluster path."))

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="settings file (TOML or JSON): [train] fields "
                                                   "of TrainConfig, [judge] fields of JudgeConfig")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "-c", "--set", help="override a setting: -c steps=20 -c ppo.lam=0.95 -c episode.max_turns=30 "
                        "-c judge.n_timed=10")]
OutOpt = Annotated[Path, typer.Option("--out", help="the stage's folder (rerun with the same one to resume)")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="actor: a Hugging Face folder, or 'tiny'")]
TasksOpt = Annotated[Optional[str], typer.Option("--tasks", help="suite, suite:cpu, a KernelBench folder, .py, "
                                                 ".jsonl or .parquet")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="rollout-and-update steps")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="the judge's backend: cuda or cpu")]
TrainDeviceOpt = Annotated[Optional[str], typer.Option("--train-device", help="torch device of actor and critic")]
EpisodesOpt = Annotated[Optional[list[Path]], typer.Option("--episodes", help="episode JSONL files or folders "
                                                           "(default: OUT/../collect/episodes, else OUT/../warmup/episodes)")]


def _fail(message: str, code: int = 2):
    print_error(err, message)
    raise typer.Exit(code)


def _settings(config, sets, **flags):
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.settings import SettingsError, load, split_overrides

    from .config import TrainConfig

    routed = split_overrides(sets, ("judge", "train"), default="train")
    try:
        judge = load(JudgeConfig, config, routed["judge"], section="judge", what="judge settings",
                     flags={"device": flags.pop("device", None)})
        train = load(TrainConfig, config, routed["train"], section="train", what="train settings", flags=flags)
    except SettingsError as exc:
        _fail(str(exc))
    return train, judge


def _need_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        _fail("training needs transformers: pip install 'cuda-agent[train]'")


class _Bar:
    """A rich progress bar over a stage's episodes or batches, and a line per finished step."""

    KEYS = ("reward_mean", "pass_rate", "sft_loss", "value_loss", "pg_loss", "vf_loss", "turns_mean",
            "entropy", "kl_ref", "judge_s_per_episode", "episodes_per_hour", "train_tokens_per_s")

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def __call__(self, what: str, done: int, total: int, metrics: dict | None) -> None:
        if self.task is None:
            self.task = self.progress.add_task(what, total=total)
        self.progress.update(self.task, description=what, completed=done, total=total)
        if metrics is None and not err.is_terminal:  # a log gets no bar: one line per finished item
            self.progress.console.print(f"{what}: {done}/{total}", markup=False, highlight=False)
        if metrics is not None:
            shown = "  ".join(f"{k} {metrics[k]:.4g}" for k in self.KEYS if isinstance(metrics.get(k), (int, float)))
            self.progress.console.print(f"{what}: {shown}")


def _rollout(mode: str, config, set_, out_dir: Path, *, collect: bool = False, **flags) -> None:
    """A stage that runs episodes through a judge pool: warmup/ppo (rollout_stage) or collect."""
    _need_transformers()
    from cuda_agent.judge import JudgeError
    from cuda_agent.pool import Pool, PoolConfig, PoolError
    from cuda_agent.rollout.evaluator import MemoEvaluator, PoolEvaluator
    from cuda_agent.tasks import TaskError

    from .stages import StageError, rollout_stage

    cfg, judge_cfg = _settings(config, set_, **flags)
    try:
        with Pool(judge_cfg, PoolConfig(judge_workers=cfg.judge_workers)) as pool:
            gate = PoolEvaluator(pool, judge_cfg)
            if cfg.judge_memo:
                gate = MemoEvaluator(gate)
            try:
                with _Bar() as bar:
                    if collect:
                        from .collect import collect_stage

                        metrics = collect_stage(cfg, out_dir, gate, mode=mode, progress=bar)
                    else:
                        metrics = rollout_stage(cfg, out_dir, gate, mode=mode, progress=bar)
            finally:
                gate.close()
    except (StageError, TaskError) as exc:
        _fail(str(exc))
    except (JudgeError, PoolError) as exc:
        _fail(f"the judge could not work: {exc}", 3)
    last = metrics[-1] if metrics else {}
    where = f"episodes in {out_dir / 'episodes'}" if collect else f"final model in {out_dir / 'final'}"
    out.print(f"{len(metrics)} steps in {out_dir}; last reward mean {last.get('reward_mean', float('nan')):.3f}, "
              f"pass rate {last.get('pass_rate', float('nan')):.2f}; {where}")


@train_app.command("warmup")
def warmup_cmd(out_dir: OutOpt, config: ConfigOpt = None, set_: SetOpt = None, model: ModelOpt = None,
               tasks: TasksOpt = None, steps: StepsOpt = None, device: DeviceOpt = None,
               train_device: TrainDeviceOpt = None) -> None:
    """Stage 1, single-turn PPO warm-up: each episode is one reply holding a whole ModelNew
    (load_inline), judged; PPO updates the actor, with a GAE critic (critic_mode: separate, a critic
    started from the actor, or shared, a value head on its backbone) or none (ppo.estimator grpo/rloo)."""
    _rollout("single_turn", config, set_, out_dir, model=model, tasks=tasks, steps=steps, device=device,
             train_device=train_device)


@train_app.command("ppo")
def ppo_cmd(out_dir: OutOpt, config: ConfigOpt = None, set_: SetOpt = None, model: ModelOpt = None,
            critic: Annotated[Optional[str], typer.Option("--critic", help="the pre-trained critic folder "
                                                          "(critic stage's OUT/final/critic)")] = None,
            tasks: TasksOpt = None, steps: StepsOpt = None, device: DeviceOpt = None,
            train_device: TrainDeviceOpt = None) -> None:
    """Stage 4, multi-turn agentic PPO: episodes of the agent in its workspace with its tools
    (token-in/token-out, observation tokens masked), the judge's milestone reward on the last
    model token, GAE with the pre-trained critic (or ppo.estimator grpo/rloo, no critic)."""
    _rollout("agentic", config, set_, out_dir, model=model, critic=critic, tasks=tasks, steps=steps, device=device,
             train_device=train_device)


@train_app.command("collect")
def collect_cmd(out_dir: OutOpt, config: ConfigOpt = None, set_: SetOpt = None, model: ModelOpt = None,
                tasks: TasksOpt = None, steps: StepsOpt = None, device: DeviceOpt = None,
                train_device: TrainDeviceOpt = None,
                mode: Annotated[str, typer.Option("--mode", help="agentic (multi-turn, the default) or "
                                                  "single_turn")] = "agentic") -> None:
    """Stages 2 and 3's data: run a model (normally the warm-up's final actor) over the tasks for
    --steps steps of episodes_per_step episodes, through the same engine, tools and judge as ppo,
    without updating it. Writes OUT/episodes/step-N.jsonl (what `rft --episodes` and `critic
    --episodes` read) and OUT/metrics.jsonl; a rerun resumes after the last written step."""
    if mode not in ("agentic", "single_turn"):
        _fail(f"--mode must be agentic or single_turn, not {mode!r}")
    _rollout(mode, config, set_, out_dir, collect=True, model=model, tasks=tasks, steps=steps, device=device,
             train_device=train_device)


@train_app.command("rft")
def rft_cmd(out_dir: OutOpt, config: ConfigOpt = None, set_: SetOpt = None, model: ModelOpt = None,
            episodes: EpisodesOpt = None, train_device: TrainDeviceOpt = None,
            export_only: Annotated[bool, typer.Option("--export-only", help="only filter and write OUT/rft.parquet "
                                                      "(for verl's SFT trainer, rft.sh)")] = False) -> None:
    """Stage 2, rejection fine-tuning: stored episodes filtered (positive reward, well-formed calls,
    no repetition loops, no hacking verdicts: the [train.rft] settings), written as verl SFT parquet
    (OUT/rft.parquet, the filter's counts in OUT/rft_filter.json), and the actor fine-tuned on them."""
    _need_transformers()
    from .stages import StageError, rft_stage

    cfg, _ = _settings(config, set_, model=model, train_device=train_device,
                       episodes=[str(p) for p in episodes] if episodes else None)
    try:
        with _Bar() as bar:
            metrics = rft_stage(cfg, out_dir, progress=bar, export_only=export_only)
    except StageError as exc:
        _fail(str(exc))
    report = (out_dir / "rft_filter.json").read_text()
    if export_only:
        out.print(f"RFT data: {out_dir / 'rft.parquet'}; filter: {report}")
    else:
        out.print(f"RFT: {len(metrics)} epochs; final actor in {out_dir / 'final' / 'actor'}; filter: {report}")


@train_app.command("critic")
def critic_cmd(out_dir: OutOpt, config: ConfigOpt = None, set_: SetOpt = None, model: ModelOpt = None,
               episodes: EpisodesOpt = None, train_device: TrainDeviceOpt = None) -> None:
    """Stage 3, critic value pre-training: a one-output token-classification model started from the
    actor (--model, normally the RFT actor), regressed on the returns of stored episodes over model
    tokens; OUT/final/critic is what `ppo --critic` and verl's critic.model.path load. With
    critic_mode=shared it is a value head (value_head.pt) on the frozen actor, for a shared-critic ppo."""
    _need_transformers()
    from .stages import StageError, critic_stage

    cfg, _ = _settings(config, set_, model=model, train_device=train_device,
                       episodes=[str(p) for p in episodes] if episodes else None)
    try:
        with _Bar() as bar:
            metrics = critic_stage(cfg, out_dir, progress=bar)
    except StageError as exc:
        _fail(str(exc))
    out.print(f"critic: {len(metrics)} epochs; final critic in {out_dir / 'final' / 'critic'}")


@train_app.command("prepare")
def prepare_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="folder for train.parquet and val.parquet")],
    tasks: Annotated[str, typer.Option("--tasks", help="suite, suite:cpu, a KernelBench folder, .py, .jsonl or "
                                       ".parquet (Ops-6K columns; `cuda-agent synth` output)")] = "suite",
    level: Annotated[Optional[list[int]], typer.Option("--level", help="KernelBench levels to keep")] = None,
    mode: Annotated[str, typer.Option("--mode", help="agentic (stage 4) or single_turn (stage 1)")] = "agentic",
    device: Annotated[str, typer.Option("--device", help="the judge's backend the prompts describe")] = "cuda",
    val_fraction: Annotated[float, typer.Option("--val-fraction", min=0.0, max=0.5)] = 0.05,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Convert task files into verl's RL parquet: prompt, data_source, reward_model.ground_truth
    (the task id), extra_info (the task itself), agent_name cuda_agent."""
    from cuda_agent.tasks import TaskError, load_tasks

    from .verl_data import write_rl_parquet

    if mode not in ("agentic", "single_turn"):
        _fail(f"--mode must be agentic or single_turn, not {mode!r}")
    if device not in ("cuda", "cpu"):
        _fail(f"--device must be cuda or cpu, not {device!r}")
    try:
        loaded = load_tasks(tasks, level or None)
        paths = write_rl_parquet(loaded, out_dir, device=device, mode=mode, val_fraction=val_fraction, seed=seed)
    except (TaskError, ValueError) as exc:
        _fail(str(exc))
    out.print(f"{len(loaded)} tasks -> " + ", ".join(str(p) for p in paths.values()))


@train_app.command("verl-config")
def verl_config_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="folder for the stage scripts, agent_loop.yaml and "
                                          "README.txt")],
    config: Annotated[Optional[Path], typer.Option("--config", help="a TOML/JSON file with a [verl] table of "
                                                   "VerlLaunch fields")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="a node layout with sizes that fit it: "
                                                  "one-node (8 GPUs, 7B-class coder, vLLM, 2 GPUs judge)")] = None,
    set_: SetOpt = None,
) -> None:
    """Write the verl launch scripts of every stage in order (prepare, warmup, collect, rft, critic,
    ppo; each training stage ends with verl's model merger, so its output is the next one's input),
    agent_loop.yaml and a README.txt listing every command and what it produces. Every setting is a
    readable override on verl's command line. Required: base_model and out, an absolute folder every
    node shares (e.g. --preset one-node -c base_model=/models/coder-7b -c out=/shared/run1)."""
    from cuda_agent.settings import SettingsError

    from .verl_config import launch_settings, write_verl_configs

    try:
        launch = launch_settings(preset, config, set_ or [])
    except (SettingsError, ValueError) as exc:
        _fail(str(exc))
    for path in write_verl_configs(launch, out_dir):
        out.print(str(path))
    out.print(f"run the stages in the order README.txt lists: {out_dir / 'README.txt'}")


@train_app.command("toy")
def toy_cmd(out_dir: Annotated[Path, typer.Argument(help="folder for the toy's model, task and settings")],
            seed: Annotated[int, typer.Option("--seed")] = 0,
            steps: Annotated[int | None, typer.Option("--steps", min=1,
                                                      help="PPO steps (default 12 for replies, 20 for calls)")] = None,
            kind: Annotated[str, typer.Option("--kind", help="replies: three tokens, each a whole reply; calls: "
                                              "five tokens, each one tool call, a reply a sampled sequence of "
                                              "them")] = "replies") -> None:
    """Build a learning check: the tiny model choosing, through the real tools and judge (CPU
    backend), between a correct and a broken RMSNorm kernel. Then run
    `cuda-agent train ppo --config OUT/toy.json --out OUT/run`: its mean reward must rise. It checks
    the gradient path, not CUDA skill."""
    _need_transformers()
    from .toy import KINDS, build_toy

    if kind not in KINDS:
        _fail(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    path = build_toy(out_dir, seed=seed, steps=steps, kind=kind)
    out.print(f"toy settings in {path}; run: cuda-agent train ppo --config {path} --out {out_dir / 'run'}")


@train_app.command("tiny-model")
def tiny_cmd(out_dir: Annotated[Path, typer.Argument(help="folder to write the model and tokenizer to")],
             seed: Annotated[int, typer.Option("--seed")] = 0) -> None:
    """Write the random tiny Qwen2 model and its tokenizer (no download): for smoke runs of every
    stage and of verl's configs. It learns plumbing, not CUDA."""
    _need_transformers()
    from .tiny import build_tiny

    build_tiny(out_dir, seed=seed)
    out.print(f"tiny model in {out_dir}")


@train_app.command("metrics")
def metrics_cmd(runs: Annotated[list[Path], typer.Argument(help="stage folders (OUT of warmup, rft, critic, "
                                                               "ppo, collect), each holding metrics.jsonl")]) -> None:
    """Print each run's metrics (OUT/metrics.jsonl) as a table, one row per step, and the time split
    of its rollout steps: generation, tools, judge and training, with episodes per hour. Exit 2 when
    a folder holds no metrics.jsonl."""
    from .runmetrics import metrics_report

    for root in runs:
        if not (root / "metrics.jsonl").is_file():
            _fail(f"{root}: no metrics.jsonl (a stage's --out folder holds one once a step has run)")
    for root in runs:
        typer.echo(metrics_report(root))   # tab-separated as written, for a reader or a pipe


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")

"""The verl launch scripts (`cuda-agent train verl-config`): every stage written in order with the
merger between them, and, in verl's environment, every script's config composed by verl's own
Hydra config and checked by its `validate_config`, the SFT config's token limits, and each merger
command line parsed by the installed verl's argparse."""

from __future__ import annotations

import shlex
import sys

import pytest

from cuda_agent.train.verl_config import PRESETS, VerlLaunch, launch_settings, write_verl_configs
from verl_fakes import compose, need_verl, script_overrides

STAGES = ["prepare.sh", "warmup.sh", "collect.sh", "rft.sh", "critic.sh", "ppo.sh"]


@pytest.fixture
def one_node(tmp_path):
    launch = launch_settings("one-node", None, ["base_model=/models/coder-7b", f"out={tmp_path / 'run'}"])
    files = write_verl_configs(launch, tmp_path / "scripts")
    return launch, tmp_path / "scripts", files


@pytest.fixture
def models(one_node, tmp_path):
    """The tiny model where each stage's model would be (verl's config check loads its tokenizer)."""
    need_verl()
    from cuda_agent.train.tiny import build_tiny

    launch = one_node[0]
    build_tiny(tmp_path / "tiny")
    for name in ["warmup-actor", "rft-actor", "critic"]:
        (tmp_path / "run" / "hf").mkdir(parents=True, exist_ok=True)
        (tmp_path / "run" / "hf" / name).symlink_to(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_one_node_preset_writes_every_stage_in_order_with_the_merger_between(one_node):
    launch, folder, files = one_node
    assert [p.name for p in files] == ["agent_loop.yaml", *STAGES, "README.txt"]
    readme = (folder / "README.txt").read_text()
    assert [readme.index(f"bash {folder.resolve() / s}") for s in STAGES] == sorted(
        readme.index(f"bash {folder.resolve() / s}") for s in STAGES)
    assert "6 per node roll out and train" in readme and "2 per node are the judge's" in readme
    hf = launch.path("hf")
    # each stage's merged output is the next stage's model
    assert f"--target_dir {hf}/warmup-actor" in (folder / "warmup.sh").read_text()
    assert f"actor_rollout_ref.model.path={hf}/warmup-actor" in (folder / "collect.sh").read_text()
    rft = (folder / "rft.sh").read_text()
    assert f"--episodes {launch.episodes('collect')}" in rft and f"model.path={hf}/warmup-actor" in rft
    assert f"--target_dir {hf}/rft-actor" in rft
    critic = (folder / "critic.sh").read_text()
    assert f"critic.model.path={hf}/rft-actor" in critic and f"--target_dir {hf}/critic" in critic
    ppo = (folder / "ppo.sh").read_text()
    assert f"actor_rollout_ref.model.path={hf}/rft-actor" in ppo and f"critic.model.path={hf}/critic" in ppo
    assert f"--target_dir {hf}/ppo-actor" in ppo


@pytest.mark.parametrize("override, message", [
    (["out=relative/run"], "absolute"),
    (["episodes_dir=eps"], "absolute"),
    (["judge_gpus_per_node=8"], "leaves no GPU"),
    (["sp_size=4"], "does not divide"),
    (["judge_gpus_per_node=1", "judge_device=cpu"], "judge_device=cuda"),
])
def test_launch_settings_refuse_what_cannot_run(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        launch_settings("one-node", None, ["base_model=/m", f"out={tmp_path}", *override])
    with pytest.raises(ValueError, match="unknown preset"):
        launch_settings("two-nodes", None, ["base_model=/m", f"out={tmp_path}"])


def test_token_limits_hold_a_whole_episode_per_sequence_parallel_group(tmp_path):
    c = VerlLaunch(base_model="/m", out=str(tmp_path))   # the defaults: 128k context, sp 8
    assert c.token_len_per_gpu * c.sp_size >= c.context == 131_072
    assert PRESETS["one-node"]["prompt_length"] + PRESETS["one-node"]["response_length"] == 32_768


# ---------------------------------------------------------------------------------------------
# With the installed verl


@pytest.mark.parametrize("script", ["warmup.sh", "collect.sh", "critic.sh", "ppo.sh"])
def test_ppo_scripts_compose_and_validate_with_verl(one_node, models, script):
    need_verl()
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    launch, folder, _ = one_node
    # the warm-up's base model is the user's: the tiny one stands in
    overrides = [o.replace("/models/coder-7b", str(models)) for o in
                 script_overrides(folder / script, "verl.trainer.main_ppo")]
    config = compose("ppo_trainer", overrides)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    t = config.trainer
    assert list(t.logger) == ["console"] and t.n_gpus_per_node == 6
    assert config.cuda_agent.judge_gpus == 2 and config.cuda_agent.episodes_dir.startswith(launch.out)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "cuda_agent"
    sp = config.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu * sp >= launch.context
    if script == "collect.sh":
        assert t.val_only and t.val_before_train and not need_critic(config)
        assert config.actor_rollout_ref.rollout.val_kwargs.n == launch.collect_rollouts
    else:
        assert not t.val_before_train and need_critic(config)
        assert config.critic.ppo_max_token_len_per_gpu * config.critic.ulysses_sequence_parallel_size >= launch.context
    if script == "critic.sh":   # every step a critic warm-up step: the actor is never updated
        # verl (trainer_base.py) updates the actor when critic_warmup <= the step, counted from 1
        assert t.total_training_steps == launch.critic_steps and t.critic_warmup > t.total_training_steps
    else:
        assert t.critic_warmup == 0


def test_rft_script_composes_with_verls_sft_config(one_node):
    need_verl()
    from verl.utils.import_utils import load_extern_object

    from cuda_agent.train.verl_sft import CudaAgentSFTDataset

    launch, folder, _ = one_node
    config = compose("sft_trainer_engine", script_overrides(folder / "rft.sh", "verl.trainer.sft_trainer"))
    assert config.optim.lr == 1e-5 and list(config.trainer.logger) == ["console"]
    assert config.data.max_length == launch.context
    assert config.data.max_token_len_per_gpu * config.engine.ulysses_sequence_parallel_size >= config.data.max_length
    assert load_extern_object(config.data.custom_cls.path, config.data.custom_cls.name) is CudaAgentSFTDataset


def test_merger_command_lines_parse_with_verls_argparse(one_node, monkeypatch):
    need_verl()
    from verl.model_merger.base_model_merger import parse_args

    launch, folder, _ = one_node
    merged = {}
    for script in ["warmup.sh", "rft.sh", "critic.sh", "ppo.sh"]:
        line = next(x for x in (folder / script).read_text().splitlines() if "verl.model_merger" in x)
        words = shlex.split(line.replace("${STEP}", "7"))
        assert words[:3] == ["python3", "-m", "verl.model_merger"]
        monkeypatch.setattr(sys, "argv", ["verl.model_merger", *words[3:]])
        args = parse_args()
        assert args.operation == "merge" and args.backend == "fsdp" and "global_step_7" in args.local_dir
        merged[script] = (args.local_dir, args.target_dir)
    assert merged["critic.sh"][0].endswith("/global_step_7/critic")
    assert merged["rft.sh"][0].endswith("/rft/global_step_7")   # the SFT trainer saves at the step's top
    assert merged["ppo.sh"] == (launch.path("checkpoints", "ppo", "global_step_7", "actor"),
                                launch.path("hf", "ppo-actor"))


def test_the_judge_asks_ray_for_gpus_only_on_the_cuda_backend_and_says_where_it_timed():
    from cuda_agent.rollout.ray_judge import gpu_note, judge_actor

    assert "dedicated" in gpu_note("cuda", ["6", "7"]) and "6,7" in gpu_note("cuda", ["6", "7"])
    assert "shared" in gpu_note("cuda", []) and "none" in gpu_note("cpu", [])
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match="only the cuda backend"):
        judge_actor({"device": "cpu"}, gpus=2)
    with pytest.raises(ValueError, match="0 or more"):
        judge_actor({"device": "cuda"}, gpus=-1)

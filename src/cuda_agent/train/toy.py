"""The learning checks: toy settings in which the right behaviour earns the judge's reward.

The task is the CPU suite's RMSNorm. The tiny random model gets extra tokens that decode to hermes
tool calls, and sampling (and the trainer's logprobs) is restricted to them and EOS. Two kinds:

`replies` (the first check): three tokens, each a whole reply

    GOOD     write_file x3: the bundled correct OpenMP solution (model_new.py, kernel, binding)
    BAD      write_file x3: the same kernel with the learned gain left out (wrong values)
    SUBMIT   submit

`calls` (the second check): five tokens, each ONE tool call, and a reply is a sampled sequence of
up to `turn_tokens` of them (EOS ends it), parsed into its calls in order:

    MODEL    write_file model_new.py          BINDING  write_file the kernel's binding
    KGOOD    write_file the correct kernel    KBAD     write_file the kernel without the gain
    SUBMIT   submit

Here no single token is a good reply: the model must learn, token by token, to write the three
files with the correct kernel last (a KBAD after a KGOOD breaks the candidate again) and to submit.
At the start most sampled episodes miss a file or end on the broken kernel; the reward's rise
checks that the per-token log-probabilities, masks and advantages of multi-token replies reach the
right tokens.

An episode has two turns in the agent's real workspace with the real tools and the real judge
(CPU backend); its reward is the judge's milestone reward as in every episode (the submitted
candidate, else the best or last judged one, else the final workspace judged once). Writing GOOD
and not overwriting it earns a positive reward; anything else earns -1. A fixed-seed PPO run must
raise the mean reward clearly over its steps. This checks the gradient path (tokens, masks,
logprobs, advantages, signs, the critic), not CUDA skill: the model only chooses between
pre-written replies.
"""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

TASK = "10_RMSNorm"


def _call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def actions() -> dict[str, str]:
    """The toy's three replies, by name."""
    root = files("cuda_agent") / "suite" / "solutions" / "cpu" / TASK
    model_new = (root / "model_new.py").read_text()
    kernel = (root / "kernels" / "rmsnorm.cpp").read_text()
    binding = (root / "kernels" / "rmsnorm_binding.cpp").read_text()
    broken = kernel.replace("yr[i] = xr[i] * inv * wp[i];", "yr[i] = xr[i] * inv;")
    if broken == kernel:
        raise RuntimeError("the toy's broken kernel no longer differs from the solution")

    def write_all(k: str) -> str:
        return "\n".join([_call("write_file", path="model_new.py", content=model_new),
                          _call("write_file", path="kernels/rmsnorm.cpp", content=k),
                          _call("write_file", path="kernels/rmsnorm_binding.cpp", content=binding)])

    return {"GOOD": write_all(kernel), "BAD": write_all(broken), "SUBMIT": _call("submit")}


def call_actions() -> dict[str, str]:
    """The `calls` check's five tokens: one tool call each (a leading newline keeps consecutive
    calls on their own lines, as a model would write them)."""
    root = files("cuda_agent") / "suite" / "solutions" / "cpu" / TASK
    kernel = (root / "kernels" / "rmsnorm.cpp").read_text()
    broken = kernel.replace("yr[i] = xr[i] * inv * wp[i];", "yr[i] = xr[i] * inv;")
    if broken == kernel:
        raise RuntimeError("the toy's broken kernel no longer differs from the solution")
    calls = {"MODEL": _call("write_file", path="model_new.py", content=(root / "model_new.py").read_text()),
             "BINDING": _call("write_file", path="kernels/rmsnorm_binding.cpp",
                              content=(root / "kernels" / "rmsnorm_binding.cpp").read_text()),
             "KGOOD": _call("write_file", path="kernels/rmsnorm.cpp", content=kernel),
             "KBAD": _call("write_file", path="kernels/rmsnorm.cpp", content=broken),
             "SUBMIT": _call("submit")}
    return {name: "\n" + text for name, text in calls.items()}


KINDS = ("replies", "calls")
# The second check needs more samples than the first: a good reply is a sequence, and with eight
# episodes a step its mean reward rose and fell back within 12 steps (H100 and CPU); with sixteen a
# step it rose from -0.81 to 1.42 (the mean of its last ten of 20 steps) on the CPU and from -0.44 to
# 1.16 on an H100, and the same with a scripted judge and a short prompt for both seeds tried
# (benchmarks/calls_check_sim.py).
DEFAULT_STEPS = {"replies": 12, "calls": 20}
EPISODES_PER_STEP = {"replies": 8, "calls": 16}


def build_toy(out: Path, *, seed: int = 0, steps: int | None = None, kind: str = "replies") -> Path:
    """Write OUT/model (the tiny model with the action tokens of `kind`), OUT/task.py and OUT/toy.json
    (settings for `cuda-agent train ppo --config OUT/toy.json`). Returns the settings file."""
    if kind not in KINDS:
        raise ValueError(f"toy kind {kind!r}: choose one of {', '.join(KINDS)}")
    steps = steps or DEFAULT_STEPS[kind]
    from tokenizers import AddedToken

    from .tiny import build_tiny

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = out / "task.py"
    task.write_text((files("cuda_agent") / "suite" / "cpu" / f"{TASK}.py").read_text())
    model, tok = build_tiny(seed=seed)
    acts = actions() if kind == "replies" else call_actions()
    tok.add_tokens([AddedToken(text, special=False, normalized=False) for text in acts.values()])
    model.resize_token_embeddings(len(tok))
    shutil.rmtree(out / "model", ignore_errors=True)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    settings = {
        "train": {
            "model": str(out / "model"), "tasks": str(task), "seed": seed, "steps": steps,
            "episodes_per_step": EPISODES_PER_STEP[kind], "concurrency": 4, "judge_memo": True,
            "allowed_tokens": list(acts.values()),
            # `calls`: up to 4 calls a reply; two turns hold the three writes and the submit
            "episode": {"max_turns": 2, "turn_tokens": 1 if kind == "replies" else 4, "temperature": 1.0},
            "optim": {"actor_lr": 3e-3, "critic_lr": 3e-3, "micro_batch": 4},
            "ppo": {"epochs": 2, "mini_batch": 8, "gamma": 1.0, "lam": 1.0},
        },
        # the toy needs correctness, not the compiled baseline
        "judge": {"device": "cpu", "compile_mode": "none"},
    }
    path = out / "toy.json"
    path.write_text(json.dumps(settings, indent=1))
    return path

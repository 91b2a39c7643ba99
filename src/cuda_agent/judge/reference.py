"""A task's reference in the judge's own process: loaded once, constructed per evaluation, fed
fresh inputs, and (on checked calls) evaluated again in float64.

Everything here runs trusted task code in the judge; none of it ever reaches a candidate process
except as bytes in the data plane (init arguments, weights, inputs).
"""

from __future__ import annotations

import copy
import random
import secrets
import types
from dataclasses import dataclass

import torch

from cuda_agent.tasks import Task

from .config import JudgeConfig
from .evaluation import JudgeError
from .stochastic import Randomness, detect
from .tensorio import move_state, nbytes_of


class Reference:
    """A task's reference module, loaded once in the judge's own process."""

    def __init__(self, task: Task):
        module = types.ModuleType(f"reference_{task.id}")
        try:
            exec(compile(task.source, task.origin or task.name, "exec"), module.__dict__)
        except Exception as exc:
            raise JudgeError(f"task {task.name}: the reference does not import: {type(exc).__name__}: {exc}") from None
        self.Model = module.Model
        self.get_inputs = module.get_inputs
        self.get_init_inputs = module.get_init_inputs
        self.randomness: Randomness | None = None  # learnt on first use (`randomness_of`)


@dataclass
class Setup:
    """One construction of the reference: its seed, arguments, weights and transport sizes."""

    init_seed: int
    init_args: list
    ref_model: torch.nn.Module
    state_names: list[str]
    state_values: list[torch.Tensor]
    in_bytes: int
    out_bytes: int
    outputs: list   # (shape, dtype name) per output, None for non-tensor outputs
    # A float64 copy of ref_model for the checked calls (made on first use), or why there is none.
    ref64: torch.nn.Module | None = None
    ref64_problem: str | None = None
    # Whether a forward changes the model's own state (an RNN keeping its hidden state in an
    # attribute, training-mode BatchNorm's running statistics): the reference must then see the
    # same calls as the candidate's model, from the same construction (`rebuild`).
    stateful: bool = False
    # What one call's inputs take in the transport (with its alignment slack): the size of the block a
    # CUDA process stages them in (JudgeConfig.stage_inputs), where in_bytes also covers the weights.
    call_in_bytes: int = 0
    # How the reference uses random numbers (stochastic.Randomness.kind: "eval", "always" or None),
    # and each module's own training flag as constructed (restored for training-mode calls).
    randomness: str | None = None
    modes: list | None = None


def _state_of(model: torch.nn.Module) -> tuple[dict, dict]:
    """What a forward can change in a module tree: its plain attributes (each tensor by identity
    and version counter, i.e. rebound or written in place, and each number), then its parameters
    and buffers (the state_dict) the same way."""
    def mark(value):
        if not isinstance(value, torch.Tensor):
            return value
        try:
            return id(value), value._version
        except RuntimeError:  # an inference tensor keeps no version counter
            return id(value), None

    plain, weights = {}, {}
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, (torch.Tensor, bool, int, float)):
                plain[f"{prefix}.{name}"] = mark(value)
        for group in (module._parameters, module._buffers):
            for name, value in group.items():
                weights[f"{prefix}.{name}"] = mark(value)
    return plain, weights


def _identity(mark):
    """Which object a `_state_of` mark names: a tensor's id, or the value itself (None, a number)."""
    return mark[0] if isinstance(mark, tuple) else mark


def _construct(ref: Reference, init_seed: int, config: JudgeConfig) -> tuple[list, torch.nn.Module]:
    torch.manual_seed(init_seed)
    init_args = list(ref.get_init_inputs())
    # seeded again, as the candidate process seeds before ModelNew (worker.py) and KernelBench before
    # each model: random state drawn at construction that is not copied (a plain attribute) matches
    torch.manual_seed(init_seed)
    return init_args, ref.Model(*init_args).to(config.device)


def rebuild(setup: Setup, ref: Reference, config: JudgeConfig) -> None:
    """A stateful reference constructed again under its seed, as a fresh candidate process
    constructs ModelNew (the judge's second round): both start from the same state again."""
    if not setup.stateful:
        return
    # dropped first, so the new model takes the old one's blocks from the allocator's cache; not
    # handed back to the driver (empty_cache): a free on the GPU slows memory-bound kernels in other
    # processes for a while after (README, "Hardware truth"), and the next calls are timed
    setup.ref_model = setup.ref64 = None
    _, setup.ref_model = _construct(ref, setup.init_seed, config)


def to_list(out) -> list:
    """A forward's result as a list of outputs."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def reference_ops(ref: Reference, device: str) -> set[str]:
    """The ATen operators a task's reference runs, from one pass under a dispatch mode in the judge's
    own process: on the meta device (no compute), else on `device` with the task's own inputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.name())
            return func(*args, **(kwargs or {}))

    for where in ("meta", device):
        rec = _Ops()
        try:
            torch.manual_seed(0)
            with torch.device(where):
                model = ref.Model(*ref.get_init_inputs())
                inputs = ref.get_inputs()
            with rec, torch.no_grad():
                model(*inputs)
            return rec.names
        except Exception:  # meta kernels missing or data-dependent code: try for real
            continue
    return set()


def randomness_of(ref: Reference, config: JudgeConfig) -> Randomness:
    """Whether the task's reference draws random numbers (stochastic.detect), learnt once per
    reference: fresh constructions under one seed, run on one input set."""
    if ref.randomness is None:
        seed = secrets.randbits(31)
        inputs = fresh_inputs(ref, secrets.randbits(63), 0, config.device)
        ref.randomness = detect(lambda: _construct(ref, seed, config)[1], inputs, atol=config.atol, rtol=config.rtol)
    return ref.randomness


def set_training(setup: Setup, training: bool) -> None:
    """A stochastic reference (and its float64 copy) in eval mode (`training` False: the random part
    switched off), or back in each module's own mode as constructed."""
    if setup.modes is None:
        setup.modes = [m.training for m in setup.ref_model.modules()]
    for m in (setup.ref_model, setup.ref64):
        if m is None:
            continue
        if training:
            for sub, flag in zip(m.modules(), setup.modes):
                sub.training = flag
        else:
            m.eval()


def reference_draws(setup: Setup, inputs: list, n: int) -> list[list]:
    """`n` evaluations of a stochastic reference on the same inputs, in its training mode, each
    under the random numbers the generator gives next (the judge's own seeds)."""
    set_training(setup, True)
    out = []
    with torch.no_grad():
        for _ in range(n):
            out.append([o.detach() if isinstance(o, torch.Tensor) else o for o in to_list(setup.ref_model(*inputs))])
    return out


def make_setup(task: Task, ref: Reference, init_seed: int, config: JudgeConfig) -> Setup:
    """The reference model under `init_seed`, its weights and the transport sizes."""
    init_args, ref_model = _construct(ref, init_seed, config)
    items = list(ref_model.state_dict().items())
    state_names = [k for k, _ in items]
    # copies, also on the CPU backend: the precision probe moves the model's own tensors and puts these back
    state_values = [t.detach().to("cpu", copy=True) for _, t in items]
    probe_inputs = fresh_inputs(ref, secrets.randbits(63), 0, config.device)
    before = _state_of(ref_model)
    with torch.no_grad():
        probe = to_list(ref_model(*probe_inputs))
    # The probe (output sizes) is a call the candidate never gets: where it changed the model's
    # state, the first checked call must still find both models in the state construction left
    # them in (KernelBench runs both from the same seed, call for call). Parameters and buffers
    # written in place (training-mode BatchNorm's running statistics) are put back from their copies;
    # a changed plain attribute (an RNN's hidden state) has no copy, and a rebound parameter or
    # buffer no place to copy to, so then the model is built again.
    after = _state_of(ref_model)
    stateful = after != before
    # (a parameter or buffer slot may hold None, e.g. a layer built with bias=False)
    rebound = any(k not in after[1] or _identity(after[1][k]) != _identity(mark) for k, mark in before[1].items())
    if after[0] != before[0] or rebound:
        ref_model = items = None  # (every reference to its tensors: the new model reuses their blocks)
        init_args, ref_model = _construct(ref, init_seed, config)
        items = list(ref_model.state_dict().items())
        state_values = [t.detach().to("cpu", copy=True) for _, t in items]
    elif stateful:
        with torch.no_grad():
            for (_, t), saved in zip(items, state_values):
                t.copy_(saved)
    out_bytes = nbytes_of(probe)
    limit_mb = config.output_limit_mb()
    if out_bytes > limit_mb << 20:
        raise JudgeError(f"task {task.name}: reference output of {out_bytes >> 20} MiB exceeds the judge's output "
                         f"limit of {limit_mb} MiB; raise the setting max_output_mb (e.g. -c max_output_mb="
                         f"{(out_bytes >> 20) + 1024})")
    in_bytes = max(nbytes_of(state_values) + nbytes_of(init_args), nbytes_of(probe_inputs)) + (1 << 20)
    outputs = [(list(t.shape), str(t.dtype).removeprefix("torch.")) if isinstance(t, torch.Tensor) else None
               for t in probe]
    randomness = randomness_of(ref, config)
    if randomness.kind is not None and stateful:
        # its extra draws per call (stochastic.py) would move its state away from the candidate's
        raise JudgeError(f"task {task.name}: the reference is stochastic ({randomness.detail}) and its forward "
                         f"changes its own state: the judge cannot check it statistically")
    torch.manual_seed(secrets.randbits(63))  # the draws of the calls: random numbers nobody chose
    return Setup(init_seed, init_args, ref_model, state_names, state_values, in_bytes, out_bytes, outputs,
                 stateful=stateful, call_in_bytes=nbytes_of(probe_inputs) + (1 << 20),
                 randomness=randomness.kind)


def expected64(setup: Setup, inputs: list, config: JudgeConfig) -> list | None:
    """The reference on a checked call's inputs in float64 (a double copy of the model, made once
    per setup; floating inputs cast to double), the basis of the noise-scaled bound. None where
    that is off or impossible (an op without double support, a model that breaks when cast, no
    memory for the copy): those calls keep the fixed bound."""
    if config.ref_noise_multiple <= 0 or setup.ref64_problem is not None:
        return None
    try:
        if setup.ref64 is None:
            setup.ref64 = copy.deepcopy(setup.ref_model).double()
        args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        with torch.no_grad():
            out = to_list(setup.ref64(*args))
    except Exception as exc:  # the task's code in float64: any failure means "no float64 basis"
        setup.ref64 = None
        setup.ref64_problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if config.device == "cuda":
            torch.cuda.empty_cache()
        return None
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in out]


def fresh_inputs(ref: Reference, seed: int, index: int, device: str) -> list:
    """A fresh input set: the task's own distribution under a secret seed, rescaled on some calls
    so that a kernel tuned to one value range is still checked on another."""
    torch.manual_seed(seed)
    # Drawn on the device: the task's own distribution, without a slow host-side generator.
    with torch.device(device):
        inputs = list(ref.get_inputs())
    if index % 3 == 1:
        rng = random.Random(seed)
        inputs = [x * rng.uniform(0.25, 1.0) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                  for x in inputs]
    return inputs


def perturb_state(setup: Setup, keys: list[str], seed: int | None, delta: float) -> None:
    """The reference's parameters and buffers named in `keys` (Model's state, in its order) moved as
    the candidate process moves the copies it made of them for a precision probe (tensorio.moved,
    signs drawn on the CPU from `seed` + the key's position), in the float32 model and its float64
    copy; `seed` None puts the original values back."""
    originals = dict(zip(setup.state_names, setup.state_values))
    for m in (setup.ref_model, setup.ref64):
        if m is not None:
            move_state(m.state_dict(), originals, keys, seed, delta)

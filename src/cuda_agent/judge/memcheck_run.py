"""The process the judge runs under compute-sanitizer (judge/memcheck.py): one checked call of the
candidate, nothing else. Everything here is assumed compromised once candidate code runs; the
judge decides on the sanitizer's exit status, not on anything this process prints.

    compute-sanitizer --tool memcheck ... python -I -m cuda_agent.judge.memcheck_run \
        --device cuda --init-seed N --input-seed M --policy strict

Its folder holds model.py (the reference), model_new.py, the candidate's libraries under libs/ (the
builds of its checked run: cuda_extension.so, lib_<name>.so) and, last, the file `go`, written by the
judge once the others are in place (they are the judge's, not the sandbox uid's, so they are written
after the process starts). Exit statuses: 0 the call ran, 3 the candidate raised, 4 the confinement
could not be installed (no candidate code ran), 5 the judge's files never arrived.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .protocol import MEMCHECK_GO_FILE as GO_FILE

GO_WAIT_S = 120.0


def _wait_for_files(workdir: str) -> bool:
    until = time.monotonic() + GO_WAIT_S
    while time.monotonic() < until:
        if os.path.exists(os.path.join(workdir, GO_FILE)):
            return True
        time.sleep(0.05)
    return False


def _confine(workdir: str, blocked: list[str]) -> None:
    """The worker's restrictions, installed before any candidate code loads: its seccomp filter and
    its audit hook; exits 4 where the filter cannot be installed."""
    from .guards import _install_audit_hook
    from .sandbox import install_seccomp

    if not install_seccomp():
        print("memcheck_run: the seccomp filter could not be installed; the candidate was not run", flush=True)
        sys.exit(4)
    _install_audit_hook(workdir, blocked)


def _load_candidate(path: str, reference, blocked: list[str], policy: str):
    """The candidate module, loaded as the worker loads it (its namespace, the one compile of the bytes read)."""
    import importlib.util

    from . import guards as g

    spec = importlib.util.spec_from_file_location("model_new", path)
    module = importlib.util.module_from_spec(spec)
    g._candidate_namespace(module, reference, blocked, policy)
    sys.modules["model_new"] = module
    with open(path, "rb") as fh:
        source = fh.read()
    g._EXPECTED_SOURCE[:] = [(os.path.realpath(path), source)]
    code = compile(source, path, "exec", dont_inherit=True)
    g._EXPECTED_SOURCE.clear()
    exec(code, module.__dict__)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--init-seed", type=int, required=True)
    ap.add_argument("--input-seed", type=int, required=True)
    ap.add_argument("--policy", default="strict")
    args = ap.parse_args(argv)
    sys.dont_write_bytecode = True
    workdir = os.getcwd()
    if not _wait_for_files(workdir):
        print("memcheck_run: the judge's files never arrived", flush=True)
        return 5

    import torch
    import torch.utils.cpp_extension as cpp_extension

    from cuda_agent.host import true_fp32

    from . import worker as w

    device = torch.device(args.device)
    true_fp32(torch)
    reference = w._load_module("model", os.path.join(workdir, "model.py"))
    sys.modules["model"] = reference
    init_args = list(reference.get_init_inputs())
    torch.manual_seed(args.init_seed)
    ref_model = reference.Model(*init_args)
    state = ref_model.state_dict() if isinstance(ref_model, torch.nn.Module) else {}
    torch.manual_seed(args.input_seed)
    with torch.device(device):
        inputs = list(reference.get_inputs())
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if device.type == "cuda":
        torch.cuda.synchronize()
    libs = os.path.join(workdir, "libs")

    def built(name, *_, **__):
        # only what the judge built for the checked run: nothing is compiled here
        path = os.path.join(libs, f"lib_{name}.so")
        if not os.path.isfile(path):
            raise RuntimeError(f"extension {name!r} was not built in the candidate's checked run")
        return w._load_module(name, path)

    def refuse(*_, **__):
        raise RuntimeError("only load_inline (or a workspace) can build extensions under the judge")

    cpp_extension.load_inline = built
    cpp_extension.load = refuse
    blocked: list[str] = []
    _confine(workdir, blocked)
    print("memcheck_run: candidate code starts", flush=True)  # memcheck.START_MARK
    try:
        workspace_lib = os.path.join(libs, "cuda_extension.so")
        if os.path.isfile(workspace_lib):
            sys.modules["cuda_extension"] = w._load_module("cuda_extension", workspace_lib)
        module = _load_candidate(os.path.join(workdir, "model_new.py"), reference, blocked, args.policy)
        torch.manual_seed(args.init_seed)
        model = module.ModelNew(*init_args)
        own = model.state_dict()
        with torch.no_grad():
            for key, value in state.items():
                if key in own and own[key].shape == value.shape and own[key].dtype == value.dtype:
                    own[key].copy_(value)
            model = model.to(device)
            model(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except BaseException as exc:  # the candidate's fault: reported, exit 3
        print(f"memcheck_run: the candidate raised: {w._trim_traceback(exc)}", flush=True)
        if blocked:
            print(f"memcheck_run: blocked: {blocked[:5]}", flush=True)
        return 3
    print("memcheck_run: call done", flush=True)  # memcheck.DONE_MARK
    return 0


if __name__ == "__main__":
    sys.exit(main())

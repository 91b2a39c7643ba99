"""The build request a candidate's `load_inline` call becomes: made in the candidate process (its
stand-in for load_inline, worker.py) and by the trusted plan of builds (build/plan.py) from the
arguments it reads statically, so that both paths hand the judge the same request. Neutral
ground: trusted code never imports the candidate process's module."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import BuildRequest


def load_inline_request(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                        extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                        build_directory=None, verbose=False, with_cuda=None, is_python_module=True,
                        with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False, **_) -> BuildRequest:
    """The build request the judge receives for a `load_inline` call (the stand-in's signature is
    load_inline's). Compile workers bind statically read arguments to it too
    (cuda_agent.judge.builds.plan), so both paths hand the judge the same request."""
    if extra_include_paths:
        raise RuntimeError("extra_include_paths is not supported by the judge")
    return {"op": "build", "name": name, "cpp_sources": cpp_sources, "cuda_sources": cuda_sources,
            "functions": functions, "cflags": extra_cflags, "cuda_cflags": extra_cuda_cflags,
            "ldflags": extra_ldflags, "with_cuda": with_cuda,
            "with_pytorch_error_handling": with_pytorch_error_handling}

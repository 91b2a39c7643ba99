"""Sandboxed build job: runs torch's ninja-based extension builder without loading the result.

Loading would run the library's static constructors (candidate code) inside the builder, which
could then rewrite the library it just produced; the judge's cache must hold only what the
compiler made from the sources.
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path


def _common_kwargs(job: dict) -> dict:
    return dict(
        name=job["name"], sources=job["sources"], extra_cflags=job["cflags"],
        extra_cuda_cflags=job["cuda_cflags"], extra_sycl_cflags=[], extra_ldflags=job["ldflags"],
        extra_include_paths=job["include"], build_directory=job["build_directory"], verbose=False,
        with_cuda=job["with_cuda"], with_sycl=False, is_standalone=False,
    )


def _accepted(fn, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def ninja_vars(ce, job: dict) -> dict[str, str]:
    """The variables (compiler, flags) of the ninja file torch's extension builder writes for this
    job, read from a probe file written next to it (nothing is compiled)."""
    ninja = Path(job["build_directory"]) / "probe.ninja"
    kwargs = _common_kwargs(job) | {"path": str(ninja)}
    ce._write_ninja_file_to_build_library(**_accepted(ce._write_ninja_file_to_build_library, kwargs))
    var = {}
    for line in ninja.read_text().splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            var[key] = value
    return var


def make_pch(ce, job: dict) -> int:
    """Precompile a judge-owned header (the binding registry, load_inline's prelude) with exactly
    the compile line torch writes for the extension's C++ files (read from a probe ninja file), so
    gcc accepts it for those files."""
    out = Path(job["build_directory"])
    header = Path(job["header"])
    probe = out / "probe.cpp"
    probe.write_text(f'#include "{header.name}"\n')
    var = ninja_vars(ce, job | {"sources": [str(probe)]})
    def compile_to(dest: Path, *args: str, unnamed: bool = False) -> subprocess.CompletedProcess:
        # unnamed: without the extension's name. gcc refuses a precompiled header for a file compiled
        # with a macro of another value, and accepts it where the macro was undefined when it was
        # made (the headers never read it), so one header serves extensions of every name.
        def flags(key: str) -> list[str]:
            return [f for f in shlex.split(var.get(key, ""))
                    if not (unnamed and f.startswith("-DTORCH_EXTENSION_NAME="))]
        cmd = (shlex.split(var.get("cxx", "c++")) + flags("cflags") + list(args)
               + ["-o", str(dest)] + flags("post_cflags"))
        return subprocess.run(cmd, capture_output=True, text=True)

    gch = out / f"{header.name}.gch"
    res = compile_to(gch.with_suffix(".gch.tmp"), "-x", "c++-header", str(header), unnamed=True)
    if res.returncode != 0:
        print(f"PCH FAILED: {res.stderr[-4000:]}", file=sys.stderr)
        return 1
    os.rename(gch.with_suffix(".gch.tmp"), gch)
    if job.get("binding"):
        # The fixed binding.cpp with the same compile line (and the header just precompiled):
        # one object every workspace build of these flags links. A failure here costs only speed.
        obj = Path(job["binding_object"])
        res = compile_to(obj.with_suffix(".tmp"), "-c", job["binding"])
        if res.returncode == 0:
            os.rename(obj.with_suffix(".tmp"), obj)
        else:
            print(f"shared binding object not made: {res.stderr[-2000:]}", file=sys.stderr)
    return 0


def main(job_path: str) -> int:
    job = json.loads(open(job_path).read())
    import torch.utils.cpp_extension as ce

    if job.get("header"):
        return make_pch(ce, job)
    builder = ce._write_ninja_file_and_build_library
    try:
        builder(**_accepted(builder, _common_kwargs(job)))
    except Exception as exc:  # the compiler output is already in the log; say why in one line
        print(f"BUILD FAILED: {type(exc).__name__}: {str(exc)[-20000:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Sandboxed build job: runs torch's ninja-based extension builder without loading the result.

Loading would run the library's static constructors (candidate code) inside the builder, which
could then rewrite the library it just produced; the judge's cache must hold only what the
compiler made from the sources.
"""

from __future__ import annotations

import inspect
import json
import sys


def main(job_path: str) -> int:
    job = json.loads(open(job_path).read())
    import torch.utils.cpp_extension as ce

    builder = ce._write_ninja_file_and_build_library
    kwargs = dict(
        name=job["name"], sources=job["sources"], extra_cflags=job["cflags"],
        extra_cuda_cflags=job["cuda_cflags"], extra_sycl_cflags=[], extra_ldflags=job["ldflags"],
        extra_include_paths=job["include"], build_directory=job["build_directory"], verbose=False,
        with_cuda=job["with_cuda"], with_sycl=False, is_standalone=False,
    )
    accepted = inspect.signature(builder).parameters
    try:
        builder(**{k: v for k, v in kwargs.items() if k in accepted})
    except Exception as exc:  # the compiler output is already in the log; say why in one line
        print(f"BUILD FAILED: {type(exc).__name__}: {str(exc)[-20000:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

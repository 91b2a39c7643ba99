"""Builds of candidate extensions, one module per job:

- builder.py: `Builder`, the sandboxed, incremental, content-addressed build of a `BuildSpec`
  (and the precompiled headers and fixed binding object builds share);
- plan.py: `plan_build`, what the judge builds for a candidate, decided in one place (and
  `build_spec`, a build with its library's imports checked);
- candidate.py: `CandidateBuilds`, the owner of a judge's builds and the policy checks around them;
- job.py: the sandboxed build job process (`python -m cuda_agent.judge.builds.job`, or the zygote's
  target "builds.job"), which runs the compiler and never loads what it made.
"""

from .builder import (INLINE_PRELUDE, LIGHT_DIR, LIGHT_EXTENSION_H, OPS_DIR, OPS_HEADER, SHARED_BINDING, BuildError,
                      Builder, BuildSpec, build_arch, check_flags, clean_flags, inline_spec, library_imports,
                      ops_header, trim_compiler_output, workspace_spec)
from .plan import (BuildOutcome, BuildPlan, build_planned, build_spec, inline_refusal, plan_build, spec_from_request,
                   static_load_inline_calls, workspace_slot)
from .candidate import CandidateBuilds  # last: it imports the observers, which take BuildSpec from here

__all__ = ["INLINE_PRELUDE", "LIGHT_DIR", "LIGHT_EXTENSION_H", "OPS_DIR", "OPS_HEADER", "SHARED_BINDING", "BuildError",
           "BuildOutcome", "BuildPlan", "BuildSpec", "Builder", "CandidateBuilds", "build_arch", "build_planned", "build_spec",
           "check_flags", "clean_flags", "inline_refusal", "inline_spec", "library_imports", "ops_header", "plan_build",
           "spec_from_request", "static_load_inline_calls", "trim_compiler_output", "workspace_slot",
           "workspace_spec"]

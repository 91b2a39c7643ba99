"""Shared by the synth tests: one torch-only crawl per test process (it takes seconds)."""

from __future__ import annotations

import functools
import types

from cuda_agent.synth.catalog import CrawlReport, SeedOp, crawl


@functools.lru_cache(maxsize=1)
def torch_catalog() -> tuple[tuple[SeedOp, ...], CrawlReport]:
    seeds, report = crawl(include_transformers=False, use_op_db=False)
    return tuple(seeds), report


def load_module(source: str) -> types.ModuleType:
    module = types.ModuleType("synth_test_task")
    exec(compile(source, "<task>", "exec", dont_inherit=True), module.__dict__)
    return module

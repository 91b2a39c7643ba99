"""Shared pytest configuration: tests marked `gpu` run only where torch sees a CUDA device."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: no GPU tier
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def judge_cache_dir(tmp_path_factory: pytest.TempPathFactory, name: str):
    """The judge cache of a test module: fresh by default; with CUDA_AGENT_TEST_CACHE set, that folder,
    shared by the modules and runs (the GPU tier fills it ahead with `cuda-agent build`, so its
    CUDA builds run many at once instead of one after another inside the tests)."""
    import os
    from pathlib import Path

    shared = os.environ.get("CUDA_AGENT_TEST_CACHE")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    return tmp_path_factory.mktemp(name)

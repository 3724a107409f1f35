"""Shared test fixtures: the real recorded outputs in ``tests/fixtures``, the tiny run config
(``tiny_config.py``), and hardware gates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
#: real recorded tool outputs and real Criteo rows, kept in the repo (tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DATA = FIXTURES / "criteo"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Recorded rccl-tests / rocm-smi / amd-smi / rocminfo / hipify outputs (each names its source)."""
    return FIXTURES


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Real Criteo rows (``criteo/SOURCE.md`` has their origin and licence)."""
    return DATA


@pytest.fixture
def tiny_config(tmp_path: Path):
    """The shared tiny run config (``tests/tiny_config.py``) with its run dir in ``tmp_path``."""
    from tiny_config import tiny_run_config

    return tiny_run_config(tmp_path / "run")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    is_rocm = getattr(torch.version, "hip", None) is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU; none visible (CPU-only machine)"))
        if "rocm" in item.keywords and not (has_gpu and is_rocm):
            item.add_marker(pytest.mark.skip(reason="needs a ROCm build with an AMD GPU"))

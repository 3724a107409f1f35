"""Shared test fixtures: where the real recorded outputs live, and hardware gates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    env = os.environ.get("ROCMTRAIN_SHARED_DIR")
    return Path(env) if env else REPO.parent / "shared"


SHARED = _shared_dir()
FIXTURES = SHARED / "fixtures"
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The project's shared folder (real Criteo rows, recorded tool outputs)."""
    if not SHARED.is_dir():
        pytest.fail(f"shared folder not found at {SHARED}; set ROCMTRAIN_SHARED_DIR")
    return SHARED


@pytest.fixture(scope="session")
def fixtures_dir(shared_dir: Path) -> Path:
    return shared_dir / "fixtures"


@pytest.fixture(scope="session")
def data_dir(shared_dir: Path) -> Path:
    return shared_dir / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    is_rocm = getattr(torch.version, "hip", None) is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU; none visible (CPU-only machine)"))
        if "rocm" in item.keywords and not (has_gpu and is_rocm):
            item.add_marker(pytest.mark.skip(reason="needs a ROCm build with an AMD GPU"))

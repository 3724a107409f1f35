"""rocmtrain.platform.placement: the GPU question answered once (device and process group)."""

from __future__ import annotations

import pytest

from rocmtrain import platform
from rocmtrain.platform import Placement


@pytest.mark.parametrize(
    ("accelerator", "process_group", "want"),
    [
        ("cpu", "auto", Placement(False, "cpu", "gloo")),
        ("cpu", "gloo", Placement(False, "cpu", "gloo")),
        ("cpu", "nccl", Placement(True, "cuda", "nccl")),  # nccl needs GPUs
        ("gpu", "auto", Placement(True, "cuda", "nccl")),
        ("gpu", "gloo", Placement(True, "cuda", "gloo")),  # an explicit backend is kept
    ],
)
def test_placement_of_explicit_settings(accelerator, process_group, want) -> None:
    assert platform.placement(accelerator, process_group) == want


@pytest.mark.parametrize("visible", [True, False])
def test_auto_follows_the_visible_gpu(monkeypatch, visible) -> None:
    monkeypatch.setattr(platform, "has_gpu", lambda: visible)
    where = platform.placement("auto")
    assert where.gpu is visible and where.gpu == platform.is_gpu_run("auto")
    assert (where.device, where.process_group) == (("cuda", "nccl") if visible else ("cpu", "gloo"))


def test_placement_is_frozen() -> None:
    with pytest.raises(AttributeError):
        platform.placement("cpu").gpu = True  # type: ignore[misc]

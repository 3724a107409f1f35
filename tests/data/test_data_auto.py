"""Data defaults chosen from the run: where synthetic batches are made, loader processes and
pinning (``data.generate_on``, ``data.num_workers=null``, ``data.pin_memory=null``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rocmtrain.config.data import DataConfig, DataConfigError, auto_num_workers
from rocmtrain.data import build_datamodule


def _dm(device: str, ranks: int = 1, **cfg):
    dm = build_datamodule(
        DataConfig(batch_size=8, num_train_batches=2, num_val_batches=1, **cfg),
        num_embeddings_per_feature=[50, 40],
        multi_hot_sizes=[2, 1],
        num_dense=3,
        seed=0,
        rank=0,
        world_size=1,
    )
    # what a DataModule reads of its trainer
    dm.trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device(device)), num_devices=ranks
    )
    dm.setup()
    return dm


def _loading(dm) -> dict:
    kwargs = dm._loader_kwargs()
    return {k: kwargs[k] for k in ("num_workers", "pin_memory")}


def test_cpu_runs_load_in_the_training_process_unpinned():
    dm = _dm("cpu")
    assert dm.train_source.device == torch.device("cpu")
    assert _loading(dm) == {"num_workers": 0, "pin_memory": False}


def test_gpu_runs_make_synthetic_batches_on_the_gpu():
    dm = _dm("cuda:0")  # nothing is allocated until a batch is asked for
    assert dm.train_source.device == torch.device("cuda:0")
    assert dm.val_source.device == torch.device("cuda:0")
    assert _loading(dm) == {"num_workers": 0, "pin_memory": False}


def test_gpu_runs_with_host_batches_get_workers_and_pinning():
    dm = _dm("cuda:0", ranks=8, generate_on="cpu")
    assert dm.train_source.device == torch.device("cpu")
    assert _loading(dm) == {"num_workers": auto_num_workers(8), "pin_memory": True}
    asked = _dm("cuda:0", num_workers=3)  # workers asked for: they generate, on the host
    assert asked.train_source.device == torch.device("cpu")
    assert _loading(asked) == {"num_workers": 3, "pin_memory": True}
    unpinned = _dm("cuda:0", generate_on="cpu", num_workers=0, pin_memory=False)
    assert _loading(unpinned) == {"num_workers": 0, "pin_memory": False}


@pytest.mark.parametrize(
    ("ranks", "cores", "workers"),
    [(1, 16, 8), (8, 128, 8), (8, 16, 1), (8, 64, 7), (2, 2, 1), (1, 1, 1)],
)
def test_auto_workers_share_the_cores_and_leave_one_per_rank(ranks, cores, workers):
    assert auto_num_workers(ranks, cores) == workers


def test_bad_values_name_the_field():
    with pytest.raises(DataConfigError, match=r"data.generate_on='gpu'.*auto, device, cpu"):
        DataConfig(generate_on="gpu").validate()
    with pytest.raises(DataConfigError, match=r"data.num_workers=2.*generate_on=device"):
        DataConfig(generate_on="device", num_workers=2).validate()
    with pytest.raises(DataConfigError, match=r"data.num_workers=-1"):
        DataConfig(num_workers=-1).validate()

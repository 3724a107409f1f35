"""``model.embedding_bounds_check``: ``auto`` turns the embedding kernel's id check off only
where the run's data make every id a row of its table, and the choice reaches the sharded kernel
(2 real gloo ranks: FBGEMM's TBE of each rank's shards holds the mode)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dist_ranks import run_ranks
from test_strategy_semi_sync import _cfg, _fit


def _kernel_modes(module) -> list[str]:
    """The bounds-check modes of the FBGEMM kernels behind this rank's sharded tables (TorchRec
    keeps a sharded collection's lookups in a plain list, outside ``modules()``)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    return sorted(
        {
            BoundsCheckMode(kernel.bounds_check_mode_int).name
            for sharded in module.modules()
            for lookup in getattr(sharded, "_lookups", None) or ()
            for kernel in lookup.modules()
            if hasattr(kernel, "bounds_check_mode_int")
        }
    )


def _worker(rank: int, root: str):
    from rocmtrain.config.schema import resolve_model_config
    from rocmtrain.models.module import DLRMModule

    seen: dict[str, list[str]] = {}

    class Recording(DLRMModule):
        def on_train_end(self) -> None:
            super().on_train_end()
            seen["modes"] = _kernel_modes(self)

    out = {}
    for i, setting in enumerate(("auto", "on")):
        cfg = _cfg(Path(root) / setting, "sparse_dist")  # synthetic data
        cfg.model.embedding_bounds_check = setting
        cfg.model = resolve_model_config(cfg)
        fit = _fit(cfg, Recording, i)
        out[setting] = dict(
            resolved=cfg.model.embedding_bounds_check, modes=seen.pop("modes"), losses=fit["losses"]
        )
    return out


@pytest.mark.slow
def test_auto_skips_the_check_for_in_range_data_and_the_kernel_gets_it(tmp_path, monkeypatch):
    monkeypatch.delenv("FBGEMM_TBE_BOUNDS_CHECK_MODE", raising=False)  # it overrides the kwarg
    for r in run_ranks(_worker, 2, str(tmp_path)):
        assert r["auto"]["resolved"] == "off" and r["on"]["resolved"] == "on"
        assert r["auto"]["modes"] == ["NONE"] and r["on"]["modes"] == ["WARNING"], r
        # the same synthetic ids, all in range: the check changes nothing but its cost
        assert r["auto"]["losses"] == r["on"]["losses"]


@pytest.mark.parametrize(
    ("kind", "rows", "want"),
    [
        ("synthetic", [1000, 50], "off"),
        ("criteo_tsv", [1000, 50], "off"),
        ("criteo_npy", [1000, 50], "off"),
        ("criteo_multihot", [40_000_000, 50], "off"),
        # a table past int32: the multi-hot reader hands the file's ids over unchanged
        ("criteo_multihot", [2**31, 50], "on"),
    ],
)
def test_auto_follows_what_the_data_guarantee(kind: str, rows: list[int], want: str) -> None:
    from rocmtrain.config.schema import RunConfig, resolve_model_config

    cfg = RunConfig()
    cfg.data.kind = kind
    cfg.model = dataclasses.replace(
        cfg.model, num_embeddings_per_feature=rows, max_rows_per_table=None,
        multi_hot_sizes=None, embedding_bounds_check="auto",
    )  # fmt: skip
    assert resolve_model_config(cfg).embedding_bounds_check == want
    cfg.model = dataclasses.replace(cfg.model, embedding_bounds_check="on")
    assert resolve_model_config(cfg).embedding_bounds_check == "on"  # a setting is kept


def test_off_and_unresolved_auto_reach_the_kernel_options() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    from rocmtrain.config.model import ModelConfig
    from rocmtrain.embedding.params import tbe_options
    from rocmtrain.models.dlrm import kernel_options

    off = kernel_options(ModelConfig(embedding_bounds_check="off"))
    assert off == {"bounds_check_mode": BoundsCheckMode.NONE}
    assert tbe_options({"optimizer": "sgd", **off})[1]["bounds_check"] is False  # kernel=triton
    # auto, unresolved (a module built straight from a ModelConfig): FBGEMM's default check
    assert kernel_options(ModelConfig(embedding_bounds_check="auto")) == {}


def test_an_unknown_setting_names_the_field() -> None:
    from rocmtrain.config import ConfigError
    from rocmtrain.config.model import ModelConfig

    with pytest.raises(ConfigError, match="model.embedding_bounds_check.*auto, on, off"):
        ModelConfig(embedding_bounds_check="maybe")

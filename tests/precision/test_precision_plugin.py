"""Precision config, the Lightning plugin (real CPU fits), submodule policy, global-state restore."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from torch import nn

from rocmtrain.config.precision import PrecisionConfig, TunableOpConfig
from rocmtrain.precision import state
from rocmtrain.precision.capabilities import capabilities_for
from rocmtrain.precision.numerics import NumericsSession
from rocmtrain.precision.plugin import (
    RocmtrainMixedPrecision,
    RocmtrainPrecision,
    build_precision_plugin,
)
from rocmtrain.precision.policy import group_modules, group_of

REPO = Path(__file__).resolve().parents[2]


class TinyDLRMModule(pl.LightningModule):
    """Named like TorchRec's DLRM; records the dtype each submodule computes in."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse_arch = nn.EmbeddingBag(20, 8, mode="sum")
        self.dense_arch = nn.Linear(4, 8)
        self.inter_arch = nn.Linear(16, 8)
        self.over_arch = nn.Linear(8, 1)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        d = self.dense_arch(x)
        e = self.sparse_arch(ids)
        i = self.inter_arch(torch.cat([d, e], 1))
        o = self.over_arch(i)
        self.seen.update(dense=d.dtype, sparse=e.dtype, inter=i.dtype, over=o.dtype)
        return o.squeeze(-1)

    def training_step(self, batch, _):
        x, ids, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self(x, ids).float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(
        torch.randn(32, 4, generator=g),
        torch.randint(0, 20, (32, 2), generator=g),
        torch.rand(32, generator=g).round(),
    )
    return torch.utils.data.DataLoader(ds, batch_size=8)


class _Snap(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.during = state.snapshot()
        self.inter_hooks = len(pl_module.inter_arch._forward_pre_hooks)


def _fit(plugin, model=None, steps: int = 2) -> tuple[TinyDLRMModule, _Snap]:
    model = model or TinyDLRMModule()
    snap = _Snap()
    trainer = pl.Trainer(
        max_steps=steps,
        plugins=[plugin],
        callbacks=[snap],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model, _loader())
    return model, snap


def test_config_validation_names_field_and_fix():
    assert PrecisionConfig(mode="bf16").mode == "bf16-mixed"
    assert PrecisionConfig(mode=32).mode == "32"  # YAML `mode: 32` arrives as an int
    with pytest.raises(ValueError, match=r"precision\.mode='bf32'.*precision=fp32\|bf16\|fp16"):
        PrecisionConfig(mode="bf32")
    with pytest.raises(ValueError, match=r"precision\.policy\.interaction='fp8'"):
        PrecisionConfig(policy={"interaction": "fp8"})
    with pytest.raises(ValueError, match="allow_xf32=true"):
        PrecisionConfig(matmul_precision="high")
    with pytest.raises(TypeError, match="atomics"):  # no such knob: nothing in training read it
        PrecisionConfig(atomics="fp32")
    with pytest.raises(ValueError, match="growth_interval"):
        PrecisionConfig(loss_scaling={"growth_interval": 0})
    assert PrecisionConfig(tunableop={"enabled": True}).tunableop.enabled


@pytest.mark.parametrize(
    ("name", "mode"), [("fp32", "32"), ("bf16", "bf16-mixed"), ("fp16", "16-mixed")]
)
def test_hydra_group_files_compose_into_the_schema(name, mode):
    merged = OmegaConf.merge(
        OmegaConf.structured(PrecisionConfig),
        OmegaConf.load(REPO / "configs" / "precision" / f"{name}.yaml"),
    )
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, PrecisionConfig) and cfg.mode == mode
    assert cfg.matmul_precision == "highest" and not cfg.allow_xf32
    plugin = build_precision_plugin(cfg)
    assert isinstance(plugin, RocmtrainPrecision if mode == "32" else RocmtrainMixedPrecision)


def test_group_names():
    assert (
        group_of("model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight")
        == "embeddings"
    )
    assert (
        group_of("dmp._dmp_wrapped_module.module.model.dense_arch.model._mlp.0._linear.weight")
        == "dense_arch"
    )
    assert group_of("model.inter_arch.crossnet.W_kernels.0") == "interaction"
    assert group_of("model.over_arch.model.1.bias") == "over_arch"
    assert group_of("lm_head.weight") == "other"
    found = group_modules(TinyDLRMModule())
    assert [n for n, _ in found["interaction"]] == ["inter_arch"]


def test_bf16_mixed_keeps_fp32_islands_and_fp32_mode_stays_fp32():
    model, snap = _fit(build_precision_plugin(PrecisionConfig(mode="bf16-mixed")))
    assert snap.inter_hooks == 1  # one island although convert_module and connect both ran
    assert len(model.inter_arch._forward_pre_hooks) == 0  # removed at teardown
    assert model.seen == {
        "dense": torch.bfloat16,
        "sparse": torch.float32,
        "inter": torch.float32,
        "over": torch.bfloat16,
    }
    # hooks removed at teardown: under autocast the interaction now runs in bf16 again
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 4), torch.randint(0, 20, (2, 2)))
    assert model.seen["inter"] == torch.bfloat16

    policy = {"interaction": "autocast", "dense_arch": "fp32"}
    model, _ = _fit(build_precision_plugin(PrecisionConfig(mode="bf16-mixed", policy=policy)))
    assert model.seen["inter"] == torch.bfloat16 and model.seen["dense"] == torch.float32

    model, _ = _fit(build_precision_plugin(PrecisionConfig(mode="32")))
    assert set(model.seen.values()) == {torch.float32}


def test_fp16_mixed_uses_configured_grad_scaler():
    plugin = build_precision_plugin(
        PrecisionConfig(mode="16-mixed", loss_scaling={"init_scale": 256.0})
    )
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    model, _ = _fit(plugin, steps=3)
    assert model.seen["dense"] == torch.float16
    assert (
        plugin.scaler.get_scale() == 256.0
    )  # finite grads at 256: no backoff, no growth before 2000
    assert build_precision_plugin(PrecisionConfig(mode="bf16-mixed")).scaler is None


def test_every_global_flag_and_env_var_is_restored_at_teardown(tmp_path, caplog):
    before = state.snapshot()
    cfg = PrecisionConfig(
        mode="16-mixed",
        fp16_alt_impl="on",
        blas_backend="hipblaslt",
        tunableop=TunableOpConfig(enabled=True, tuning=True, max_tuning_duration_ms=30),
    )
    with caplog.at_level(logging.INFO, logger="rocmtrain"):
        _, snap = _fit(build_precision_plugin(cfg, run_dir=tmp_path))
    changed = state.diff(before, snap.during)
    # what the plugin changes on this machine, whatever the defaults were before
    assert snap.during["float32_matmul_precision"] == "highest"
    assert snap.during["cuda.matmul.allow_fp16_reduced_precision_reduction"] is False
    assert snap.during["cuda.matmul.allow_bf16_reduced_precision_reduction"] is False
    assert snap.during["cudnn.allow_tf32"] is False
    assert snap.during["env.ROCBLAS_INTERNAL_FP16_ALT_IMPL"] == "1"
    assert snap.during["env.MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL"] == "1"
    assert snap.during["env.PYTORCH_TUNABLEOP_ENABLED"] == "1"
    assert snap.during["env.PYTORCH_TUNABLEOP_TUNING"] == "1"
    assert snap.during["env.PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS"] == "30"
    assert snap.during["env.PYTORCH_TUNABLEOP_FILENAME"] == str(
        tmp_path / "tunableop" / "tunableop_results_cpu_%d.csv"
    )
    assert len(changed) >= 6
    assert state.snapshot() == before, state.diff(before, state.snapshot())
    # every change was logged, and so was its undo
    for key in changed:
        assert f"restored {key}" in caplog.text
    assert "no effect without a GPU" in caplog.text  # blas_backend on CPU
    assert "TunableOp: no effect on CPU" in caplog.text


def test_user_env_wins_and_is_left_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCBLAS_INTERNAL_FP16_ALT_IMPL", "0")
    before = state.snapshot()
    session = NumericsSession(PrecisionConfig(fp16_alt_impl="on"), run_dir=tmp_path)
    report = "\n".join(session.apply())
    assert "the user's '0' wins" in report
    assert state.snapshot()["env.ROCBLAS_INTERNAL_FP16_ALT_IMPL"] == "0"
    session.restore()
    assert state.snapshot() == before


def test_report_on_gfx90a_says_tf32_and_reduction_flags_have_no_effect():
    before = state.snapshot()
    session = NumericsSession(PrecisionConfig(allow_xf32=True), caps=capabilities_for("gfx90a"))
    report = "\n".join(session.apply())
    assert "allow_xf32=true has no effect on gfx90a" in report
    assert "cuda.matmul.allow_tf32: " in report and "no effect on gfx90a: no TF32/XF32" in report
    assert "marked unsupported on ROCm" in report
    assert "gfx90a: fp16 MFMA flush denormals" in report
    assert torch.get_float32_matmul_precision() == "highest"
    session.restore()
    assert state.snapshot() == before


def test_xf32_opt_in_on_gfx942_warns_and_is_undone(tmp_path):
    before = state.snapshot()
    (tmp_path / "tunableop").mkdir()
    (tmp_path / "tunableop" / "tunableop_results_gfx942_0.csv").write_text(
        "Validator,PT_VERSION,2.13.0\n"
    )
    cfg = PrecisionConfig(allow_xf32=True, tunableop=TunableOpConfig(enabled=True, tuning=False))
    session = NumericsSession(cfg, run_dir=tmp_path, caps=capabilities_for("gfx942"))
    report = "\n".join(session.apply())
    assert "error is close to bf16" in report
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert state.snapshot()["env.HIPBLASLT_ALLOW_TF32"] == "1"
    assert "TunableOp: reusing" in report and "tunableop_results_gfx942_0.csv" in report
    assert state.snapshot()["env.PYTORCH_TUNABLEOP_TUNING"] == "0"
    session.restore()
    assert state.snapshot() == before

    # no results file yet: say how to create one
    session = NumericsSession(cfg, run_dir=tmp_path / "fresh", caps=capabilities_for("gfx942"))
    assert "tuning=true to create it" in "\n".join(session.apply())
    session.restore()
    assert state.snapshot() == before


def test_restore_keep_leaves_named_settings(monkeypatch):
    before = state.snapshot()
    monkeypatch.setenv("PYTORCH_TUNABLEOP_VERBOSE", "1")
    torch.backends.cudnn.allow_tf32 = not before["cudnn.allow_tf32"]
    restored = state.restore(before, keep=("env.PYTORCH_TUNABLEOP_VERBOSE",))
    assert "cudnn.allow_tf32" in restored and not any(k.startswith("env.") for k in restored)
    assert state.snapshot()["env.PYTORCH_TUNABLEOP_VERBOSE"] == "1"
    assert state.restore(before) == ["env.PYTORCH_TUNABLEOP_VERBOSE"]
    assert state.snapshot() == before

"""GradHealthCallback on a real tiny Lightning run on the CPU with a NaN injected at a known step."""

from __future__ import annotations

import csv
import math

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch import nn

from rocmtrain.config.precision import GradHealthConfig
from rocmtrain.precision.grad_health import GradHealthCallback

NAN_STEP = 3


class NanAtStep(pl.LightningModule):
    """dense → interaction → over; at NAN_STEP the grads of inter_arch.weight and over_arch.weight
    (only those) become NaN: ``loss + nan * w.sum()`` has d/dw = nan, other grads stay finite."""

    def __init__(self) -> None:
        super().__init__()
        self.dense_arch = nn.Linear(4, 8)
        self.inter_arch = nn.Linear(8, 8)
        self.over_arch = nn.Linear(8, 1)

    def training_step(self, batch, _):
        x, y = batch
        out = self.over_arch(torch.relu(self.inter_arch(torch.relu(self.dense_arch(x))))).squeeze(
            -1
        )
        loss = nn.functional.binary_cross_entropy_with_logits(out, y)
        if self.global_step == NAN_STEP:
            poison = self.over_arch.weight.sum() + self.inter_arch.weight.sum()
            loss = loss + poison * float("nan")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class ParamTrace(pl.Callback):
    def __init__(self) -> None:
        self.params: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.params.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})


def _run(tmp_path, action: str):
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=g), torch.rand(64, generator=g).round()
    )
    health = GradHealthCallback(log_every_n_steps=1, on_nonfinite=action)
    trace = ParamTrace()
    trainer = pl.Trainer(
        max_steps=6,
        callbacks=[health, trace],
        logger=CSVLogger(tmp_path, name="gh"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    model = NanAtStep()
    trainer.fit(model, torch.utils.data.DataLoader(ds, batch_size=8))
    return health, trace, trainer


def _metrics(trainer) -> list[dict[str, str]]:
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        return list(csv.DictReader(f))


def test_nan_is_named_and_step_skipped(tmp_path, caplog):
    health, trace, trainer = _run(tmp_path, "skip_step")
    assert len(health.events) == 1
    ev = health.events[0]
    assert (ev.step, ev.parameter, ev.group, ev.kind) == (
        NAN_STEP,
        "inter_arch.weight",
        "interaction",
        "nan",
    )
    assert ev.num_bad_parameters == 2 and ev.action == "skipped"
    assert health.skipped_steps == [NAN_STEP]
    assert "NAN gradient at step 3 in parameter 'inter_arch.weight'" in caplog.text
    # the skipped step left every parameter untouched; the others moved; nothing became NaN
    before, after = trace.params[NAN_STEP - 1], trace.params[NAN_STEP]
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not torch.equal(
        trace.params[NAN_STEP]["dense_arch.weight"], trace.params[NAN_STEP + 1]["dense_arch.weight"]
    )
    assert all(bool(torch.isfinite(p).all()) for p in trace.params[-1].values())
    assert trainer.global_step == 6

    rows = _metrics(trainer)
    flags = {
        int(r["step"]): float(r["grad_health/nonfinite"])
        for r in rows
        if r.get("grad_health/nonfinite")
    }
    assert flags == {s: float(s == NAN_STEP) for s in range(6)}
    bad = next(r for r in rows if int(r["step"]) == NAN_STEP and r.get("grad_health/nonfinite"))
    assert float(bad["grad_health/nonfinite_params"]) == 2.0
    # that step's group norms show where the NaN is
    assert math.isnan(float(bad["grad_norm/interaction"])) and math.isnan(
        float(bad["grad_norm/over_arch"])
    )
    assert math.isfinite(float(bad["grad_norm/dense_arch"]))
    # per-group norms add up to the total (independent recomputation from the logged values)
    r0 = next(r for r in rows if r.get("grad_norm/total"))
    groups = [float(r0[f"grad_norm/{g}"]) for g in ("dense_arch", "interaction", "over_arch")]
    assert math.isclose(
        math.sqrt(sum(v * v for v in groups)), float(r0["grad_norm/total"]), rel_tol=1e-5
    )


def test_nan_with_log_action_poisons_and_raise_action_stops(tmp_path):
    health, trace, _ = _run(tmp_path / "log", "log")
    assert health.events[0].action == "logged" and health.skipped_steps == []
    assert not bool(torch.isfinite(trace.params[NAN_STEP]["inter_arch.weight"]).all())
    assert bool(torch.isfinite(trace.params[NAN_STEP]["dense_arch.weight"]).all())

    with pytest.raises(
        FloatingPointError, match=r"step 3 in parameter 'inter_arch\.weight'.*skip_step"
    ):
        _run(tmp_path / "raise", "raise")


def test_bad_settings_fail():
    with pytest.raises(ValueError, match="on_nonfinite='ignore'"):
        GradHealthCallback(on_nonfinite="ignore")
    with pytest.raises(ValueError, match="log_every_n_steps"):
        GradHealthConfig(log_every_n_steps=0)
    cb = GradHealthCallback.from_config(GradHealthConfig(log_every_n_steps=7, on_nonfinite="log"))
    assert cb._every == 7 and cb._action == "log"

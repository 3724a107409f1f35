"""GradHealthCallback on a real tiny Lightning run on the CPU with a NaN injected at a known step."""

from __future__ import annotations

import csv
import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch import nn

from rocmtrain.callbacks.grad_health import UNCHECKED, GradHealthCallback, grad_norms
from rocmtrain.config.precision import GradHealthConfig

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
    health = GradHealthCallback(log_every_n_steps=1, on_nonfinite=action)
    trace, trainer = _fit(tmp_path, NanAtStep(), health, max_steps=6)
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


# --- check_every_n_steps > 1: device-side window, one host sync per check ---------------------


class NanAtSteps(NanAtStep):
    """NanAtStep plus ``probe``, a parameter with a gradient that the optimizer does not update.
    At ``probe_steps`` only the probe's grad is NaN (so stepping that step leaves every parameter
    finite: the run can go on); at ``model_steps`` inter_arch.weight and over_arch.weight get NaN
    grads, as in NanAtStep."""

    def __init__(self, probe_steps=(), model_steps=()) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.ones(3))
        self.probe_steps, self.model_steps = set(probe_steps), set(model_steps)

    def training_step(self, batch, _):
        x, y = batch
        out = self.over_arch(torch.relu(self.inter_arch(torch.relu(self.dense_arch(x))))).squeeze(
            -1
        )
        loss = nn.functional.binary_cross_entropy_with_logits(out, y)
        loss = loss + self.probe.sum() * (
            float("nan") if self.global_step in self.probe_steps else 0.0
        )
        if self.global_step in self.model_steps:
            loss = loss + (self.over_arch.weight.sum() + self.inter_arch.weight.sum()) * float(
                "nan"
            )
        return loss

    def configure_optimizers(self):
        params = [p for n, p in self.named_parameters() if n != "probe"]
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad()
        self.probe.grad = None  # not in the optimizer: clear it here, or a NaN would accumulate


def _fit(tmp_path, model, health, max_steps, accelerator="cpu"):
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(
        torch.randn(128, 4, generator=g), torch.rand(128, generator=g).round()
    )
    trace = ParamTrace()
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[health, trace],
        logger=CSVLogger(tmp_path, name="gh"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator=accelerator,
        devices=1,
    )
    trainer.fit(model, torch.utils.data.DataLoader(ds, batch_size=8))
    return trace, trainer


def _per_step(trainer, key) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in _metrics(trainer) if r.get(key)}


def test_unchecked_nan_is_reported_at_next_check_and_at_train_end(tmp_path, caplog):
    # checks at steps 0, 4, 8; NaN at unchecked steps 5 and 6 (next check: 8) and 10 (after the
    # last check: reported at the end of training)
    health = GradHealthCallback(
        log_every_n_steps=50, on_nonfinite="skip_step", check_every_n_steps=4
    )
    model = NanAtSteps(probe_steps=(5, 6, 10))
    trace, trainer = _fit(tmp_path, model, health, max_steps=12)

    assert trainer.global_step == 12
    assert [(e.step, e.parameter, e.action, e.num_steps) for e in health.events] == [
        (5, UNCHECKED, "logged_late", 2),
        (10, UNCHECKED, "logged_late", 1),
    ]
    assert health.skipped_steps == []  # unchecked steps are not skipped
    assert (
        "2 step(s) with a NaN/Inf gradient norm since the previous check, the first at step 5 (found by the check at step 8"
        in caplog.text
    )
    assert (
        "1 step(s) with a NaN/Inf gradient norm since the previous check, the first at step 10 (found by the end of training"
        in caplog.text
    )
    # those steps were stepped (the probe's NaN is not in the optimizer), and the run stayed finite
    assert not torch.equal(
        trace.params[4]["dense_arch.weight"], trace.params[5]["dense_arch.weight"]
    )
    assert all(bool(torch.isfinite(p).all()) for p in trace.params[-1].values())
    # per-step flags are logged from device tensors on every step, unchecked ones included
    assert _per_step(trainer, "grad_health/nonfinite") == {
        s: float(s in (5, 6, 10)) for s in range(12)
    }
    assert _per_step(trainer, "grad_health/nonfinite_params") == {
        s: float(s in (5, 6, 10)) for s in range(12)
    }
    since = {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 2, 7: 2, 8: 2, 9: 0, 10: 1, 11: 1}
    assert _per_step(trainer, "grad_health/nonfinite_steps_since_check") == {
        s: float(v) for s, v in since.items()
    }


def test_check_step_still_skips_and_names_the_parameter(tmp_path, caplog):
    # NaN in the probe at unchecked step 2, NaN in the model at check step 4
    health = GradHealthCallback(
        log_every_n_steps=50, on_nonfinite="skip_step", check_every_n_steps=4
    )
    trace, trainer = _fit(tmp_path, NanAtSteps(probe_steps=(2,), model_steps=(4,)), health, 7)

    assert [
        (e.step, e.parameter, e.action, e.num_bad_parameters, e.num_steps) for e in health.events
    ] == [
        (2, UNCHECKED, "logged_late", 0, 1),
        (4, "inter_arch.weight", "skipped", 2, 1),
    ]
    assert health.skipped_steps == [4]
    assert "NAN gradient at step 4 in parameter 'inter_arch.weight'" in caplog.text
    before, after = trace.params[3], trace.params[4]  # params after steps 3 and 4
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not torch.equal(after["dense_arch.weight"], trace.params[5]["dense_arch.weight"])
    assert all(bool(torch.isfinite(p).all()) for p in trace.params[-1].values())
    assert trainer.global_step == 7
    assert _per_step(trainer, "grad_health/nonfinite_params")[4] == 2.0
    # the check that found a NaN also logged that step's group norms
    assert math.isnan(_per_step(trainer, "grad_norm/interaction")[4])


def test_unchecked_nan_under_raise_stops_at_the_next_check(tmp_path):
    health = GradHealthCallback(on_nonfinite="raise", check_every_n_steps=4)
    with pytest.raises(FloatingPointError, match=r"first at step 5 \(found by the check at step 8"):
        _fit(tmp_path, NanAtSteps(probe_steps=(5,)), health, max_steps=12)
    assert [(e.step, e.action) for e in health.events] == [(5, "raised_late")]
    # after the last check (8), a NaN at step 10 stops the run at the end of training
    health = GradHealthCallback(on_nonfinite="raise", check_every_n_steps=4)
    with pytest.raises(
        FloatingPointError, match=r"first at step 10 \(found by the end of training"
    ):
        _fit(tmp_path / "end", NanAtSteps(probe_steps=(10,)), health, max_steps=12)


def test_check_every_n_steps_is_validated_and_configured():
    with pytest.raises(
        ValueError,
        match=r"precision\.grad_health\.check_every_n_steps=0 must be >= 1\. "
        r"Set precision\.grad_health\.check_every_n_steps=1",
    ):
        GradHealthConfig(check_every_n_steps=0)
    with pytest.raises(ValueError, match=r"check_every_n_steps=-3 must be >= 1"):
        GradHealthCallback(check_every_n_steps=-3)
    assert GradHealthConfig().check_every_n_steps == 1
    cb = GradHealthCallback.from_config(GradHealthConfig(check_every_n_steps=50))
    assert cb._check_every == 50


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_foreach_norms_match_fp64_reference(dtype):
    g = torch.Generator().manual_seed(1)
    grads = [
        (torch.randn(1000, 37, generator=g) * 1e-3).to(dtype),
        torch.randn(5, generator=g).to(dtype),
        torch.full((1000,), 3000.0).to(dtype),  # norm 9.5e4: above fp16's max (65504)
        torch.zeros(7, dtype=dtype),
    ]
    norms = grad_norms(grads)
    assert norms.dtype == torch.float32 and norms.shape == (4,)
    ref = torch.stack([x.double().norm() for x in grads])
    # fp32 rounding of a sum of 3.7e4 squares (the same in vector_norm): well under 1e-5
    torch.testing.assert_close(norms.double(), ref, rtol=1e-5, atol=0.0)
    vector = torch.stack([torch.linalg.vector_norm(x, dtype=torch.float32) for x in grads])
    torch.testing.assert_close(norms, vector, rtol=2e-7, atol=0.0)
    if dtype != torch.float32:  # without dtype=float32 the norms come back rounded to 16 bits
        naive = torch.stack(torch._foreach_norm(grads)).double()
        assert not torch.allclose(naive, ref, rtol=1e-5, atol=0.0)
    bad = grad_norms(
        [torch.tensor([1.0, float("nan")]).to(dtype), torch.tensor([float("inf")]).to(dtype)]
    )
    assert math.isnan(bad[0]) and math.isinf(bad[1])


@pytest.mark.gpu
def test_unchecked_steps_do_not_sync_and_a_check_syncs_once(tmp_path):
    """On a GPU: CUDA's sync debug mode errors on any sync inside an unchecked step's hook, and a
    check step's hook (grad norms logged too) syncs exactly once, in grad_health.py. Step 0 is
    left out: on an H200 it also had a one-time sync inside ``torch.cuda`` (first-step setup)."""
    syncs: dict[int, list[str]] = {}

    class Guarded(GradHealthCallback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            step = trainer.global_step
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn" if step % 4 == 0 else "error")
                try:
                    super().on_before_optimizer_step(trainer, pl_module, optimizer)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs[step] = [
                f"{w.filename}:{w.lineno}" for w in seen if "synchroniz" in str(w.message)
            ]

    health = Guarded(log_every_n_steps=4, on_nonfinite="skip_step", check_every_n_steps=4)
    _, trainer = _fit(tmp_path, NanAtSteps(probe_steps=(5,)), health, 12, accelerator="gpu")
    assert [(e.step, e.action, e.num_steps) for e in health.events] == [(5, "logged_late", 1)]
    assert sorted(syncs) == list(range(12))
    assert all(not syncs[s] for s in range(12) if s % 4), syncs  # "error" mode would have raised
    assert (len(syncs[4]), len(syncs[8])) == (1, 1), syncs
    assert "grad_health.py" in syncs[8][0]
    assert math.isfinite(_per_step(trainer, "grad_norm/total")[8])

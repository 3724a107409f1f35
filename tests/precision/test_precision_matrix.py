"""Precision matrix: metrics vs hand-computed values, real CPU runs, --compare end to end, drift."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rocmtrain.precision import drift, matrix
from rocmtrain.precision.matrix_ops import OPS, dot_interaction, error_metrics, ulp

REPO = Path(__file__).resolve().parents[2]


def test_ulp_and_error_metrics_against_hand_values():
    r = torch.tensor([1.0, 1.5, 1024.0, 2.0**-20, 0.0], dtype=torch.float64)
    assert ulp(r, "fp16").tolist() == [
        2.0**-10,
        2.0**-10,
        1.0,
        2.0**-24,
        2.0**-24,
    ]  # subnormal spacing
    assert ulp(r, "bf16").tolist()[:3] == [2.0**-7, 2.0**-7, 8.0]
    assert ulp(r[:1], "fp32").item() == 2.0**-23

    ref = torch.tensor([1.0, 2.0, 4.0, -8.0], dtype=torch.float64)
    out = ref * (1 + torch.tensor([0.0, 2.0**-10, 0.0, -(2.0**-11)], dtype=torch.float64))
    m = error_metrics(out, ref, "fp16")
    assert m["max_rel"] == 2.0**-10 and m["mean_rel"] == (2.0**-10 + 2.0**-11) / 4
    assert m["max_ulp"] == 1.0 and m["n"] == 4 and m["nonfinite"] == 0
    # floor: an output ~0 by cancellation is judged against 1e-3 of the output scale
    m0 = error_metrics(
        torch.tensor([1e-9, 100.0]), torch.tensor([0.0, 100.0], dtype=torch.float64), "fp32"
    )
    assert math.isclose(m0["max_rel"], 1e-9 / 0.1, rel_tol=1e-6)
    assert math.isinf(
        error_metrics(torch.tensor([math.inf]), torch.tensor([1.0]), "fp16")["max_rel"]
    )


def test_dot_interaction_matches_explicit_pairs():
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    z = dot_interaction(x)
    want = torch.stack(
        [torch.stack([x[b, i] @ x[b, j] for i in range(5) for j in range(i)]) for b in range(3)]
    )
    assert z.shape == (3, 10) and torch.allclose(z, want)


def test_cpu_matrix_values_are_sane():
    doc = matrix.run_matrix(device="cpu", ops=["exp", "sqrt", "softmax", "matmul"])
    res = doc["results"]
    assert set(res) == {"exp", "sqrt", "softmax", "matmul"}
    assert set(res["exp"]) == {"fp16", "bf16", "fp32"}  # no tf32 column on the CPU
    for op in res:
        assert res[op]["fp32"]["max_rel"] < res[op]["fp16"]["max_rel"] < res[op]["bf16"]["max_rel"]
        assert res[op]["bf16"]["max_rel"] < 2.0**-7  # within one bf16 epsilon
    # an elementwise op is at most a few ULP off in its own dtype
    assert res["exp"]["fp16"]["max_ulp"] <= 2.0 and res["sqrt"]["bf16"]["max_ulp"] <= 2.0
    assert doc["platform"]["backend"] == "cpu" and doc["platform"]["torch"] == torch.__version__


def test_compare_threshold_and_floor():
    base = {
        "kind": "precision-matrix",
        "results": {
            "exp": {
                "fp16": {"max_rel": 4.9e-4, "mean_rel": 1e-4},
                "fp32": {"max_rel": 1e-8, "mean_rel": 1e-9},
            }
        },
    }
    same = json.loads(json.dumps(base))
    assert matrix.compare(same, base)[0] == []
    worse = json.loads(json.dumps(base))
    worse["results"]["exp"]["fp16"]["max_rel"] = 9.8e-4  # 0.5 ULP → 1 ULP: x2 and 0.5 eps
    worse["results"]["exp"]["fp32"]["max_rel"] = 3e-8  # x3 but 0.17 eps(fp32): below the floor
    worse["results"]["exp"]["tf32"] = {"max_rel": 1e-3, "mean_rel": 1e-4}
    bad, ok, missing = matrix.compare(worse, base)
    assert len(bad) == 1 and bad[0].startswith("exp/fp16: max_rel 4.900e-04 -> 9.800e-04 (x2.0)")
    assert ok[0].startswith("exp/fp32") and missing == ["exp/tf32: only in new run"]
    assert matrix.compare(worse, base, threshold=2.5)[0] == []


@pytest.mark.slow
def test_cli_end_to_end_pass_then_fail_on_scaled_baseline(tmp_path, capsys):
    ops = "exp,log1p,rsqrt,layer_norm,embedding_bag_sum,dlrm_interaction"
    a, b, png = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.png"
    assert matrix.main(["--device", "cpu", "--ops", ops, "--out", str(a), "--png", str(png)]) == 0
    doc = json.loads(a.read_text())
    assert (
        doc["kind"] == "precision-matrix"
        and doc["schema"] == 1
        and "precision-matrix" in doc["command"]
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second real run on the same platform compares clean (deterministic seeded inputs)
    assert matrix.main(["--device", "cpu", "--ops", ops, "--out", str(b), "--compare", str(a)]) == 0
    assert "OK: 18 op/dtype pair(s) within threshold" in capsys.readouterr().out

    # a baseline claiming 10x smaller errors for two ops: the same run must now fail naming them
    scaled = json.loads(a.read_text())
    for op in ("log1p", "dlrm_interaction"):
        for m in scaled["results"][op].values():
            m["max_rel"] /= 10
            m["mean_rel"] /= 10
    base = tmp_path / "scaled.json"
    base.write_text(json.dumps(scaled))
    rc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmtrain",
            "precision-matrix",
            "--compare",
            str(base),
            "--against",
            str(b),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert rc.returncode == 1, rc.stdout + rc.stderr
    regressions = [
        ln.split()[1] for ln in rc.stdout.splitlines() if ln.strip().startswith("REGRESSION")
    ]
    assert sorted(regressions) == sorted(
        f"{op}/{d}:" for op in ("log1p", "dlrm_interaction") for d in ("fp16", "bf16", "fp32")
    )


def test_cli_usage_errors(tmp_path, capsys):
    assert matrix.main(["--ops", "exp,cosh", "--device", "cpu"]) == 2
    assert "unknown op(s) ['cosh']" in capsys.readouterr().err
    assert matrix.main(["--against", "x.json"]) == 2
    assert matrix.main(["--threshold", "0.5"]) == 2
    if not torch.cuda.is_available():
        assert matrix.main(["--device", "cuda"]) == 2
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a precision-matrix JSON"):
        matrix.main(["--device", "cpu", "--ops", "exp", "--compare", str(tmp_path / "junk.json")])


def test_model_drift_same_platform_is_zero_and_perturbed_run_fails(tmp_path, capsys):
    run = drift.run_model(steps=6)
    again = drift.run_model(steps=6)
    assert (
        run["loss"] == again["loss"] and run["auc"] == again["auc"]
    )  # bit-reproducible on one platform
    assert drift.compare(again, run) == []
    assert len(run["loss"]) == 6 and 0.0 <= run["auc"] <= 1.0
    moved = dict(run, loss=[v * 1.01 for v in run["loss"]], auc=run["auc"] + 0.01)
    problems = drift.compare(moved, run)
    assert problems[0].startswith("loss drift 1.00e-02 at step 0") and "AUC drift" in problems[1]
    assert "same --drift-mode" in drift.compare(dict(run, mode="bf16-mixed"), run)[0]

    # through the CLI: both files carry model_drift, compare reports it and fails on the moved one
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert (
        matrix.main(
            [
                "--device",
                "cpu",
                "--ops",
                "exp",
                "--model-drift",
                "--drift-steps",
                "4",
                "--out",
                str(a),
            ]
        )
        == 0
    )
    doc = json.loads(a.read_text())
    assert doc["model_drift"]["steps"] == 4
    doc["model_drift"]["loss"] = [v * 1.5 for v in doc["model_drift"]["loss"]]
    b.write_text(json.dumps(doc))
    capsys.readouterr()
    assert matrix.main(["--compare", str(b), "--against", str(a)]) == 1
    out = capsys.readouterr().out
    assert "model drift: loss drift" in out and "max relative loss drift over 4 steps" in out


def test_auc_matches_torchmetrics():
    from torchmetrics.functional.classification import binary_auroc

    g = torch.Generator().manual_seed(5)
    s = torch.randn(300, generator=g).round(decimals=1)  # ties
    y = (torch.rand(300, generator=g) < 0.4).float()
    assert math.isclose(drift.auc(s, y), float(binary_auroc(s, y.long())), rel_tol=1e-6)


def test_committed_cpu_baseline_is_complete():
    doc = json.loads((REPO / "rocmtrain" / "precision" / "baselines" / "cpu.json").read_text())
    assert set(doc["results"]) == {op.name for op in OPS}
    assert doc["platform"]["backend"] == "cpu" and "model_drift" in doc


def test_bad_output_and_baseline_paths_fail_before_the_matrix_runs(tmp_path, capsys, monkeypatch):
    """A folder as --png, an unwritable --out, a binary or missing --compare: one line, before
    any op is measured (the matrix itself is never reached), and nothing claimed as written."""
    ran: list[str] = []
    real_run_matrix = matrix.run_matrix
    monkeypatch.setattr(
        matrix, "run_matrix", lambda **kw: ran.append("ran") or real_run_matrix(**kw)
    )
    folder = tmp_path / "plots"
    folder.mkdir()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    binary = tmp_path / "base.json"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 64)
    base = ["--device", "cpu", "--ops", "exp"]
    assert matrix.main([*base, "--png", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"--png {folder} is not a .png file name (it is a folder)" in err and "wrote" not in err
    if os.geteuid() != 0:  # root writes into a read-only folder
        assert matrix.main([*base, "--out", str(locked / "m.json")]) == 2
        assert "cannot write there (Permission denied)" in capsys.readouterr().err
    assert matrix.main([*base, "--out", "/proc/m.json"]) == 2
    assert "--out /proc/m.json: cannot write there" in capsys.readouterr().err
    for bad in (binary, tmp_path / "missing.json"):
        with pytest.raises(SystemExit, match=f"cannot read {bad}"):
            matrix.main([*base, "--compare", str(bad)])
    assert ran == [] and not list(folder.iterdir())

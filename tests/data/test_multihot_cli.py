"""The real CLI on multi-hot files: ``recipe=dlrm_cpu`` (2 gloo ranks, 8 tables of 2,000 rows)
trains from a written planted-signal set to val AUC >= 0.75 in one short epoch, and bad files
end with one ``rocmtrain: error:`` line, exit code 2 and no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rocmtrain.data.multihot_writer import main as write_data

REPO = Path(__file__).resolve().parents[2]


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "rocmtrain", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow  # one CLI training run: 2 gloo ranks, ~78 steps, ~20 s on 2 cores
def test_cli_trains_dlrm_cpu_on_a_written_multihot_set(tmp_path):
    data = tmp_path / "mh"
    tables, hot = ",".join(["2000"] * 8), "3,1,2,1,4,1,2,1"
    rows = "40000,8000"  # day 0 trains; day 1's first half validates (MLPerf's split)
    assert write_data(["synthetic", str(data), "--rows", rows, "--tables", tables,
                       "--hot-sizes", hot, "--workers", "2"]) == 0  # fmt: skip
    run = _start(
        "recipe=dlrm_cpu", "data=criteo_multihot", f"data.path={data}", "data.batch_size=256",
        "trainer.max_epochs=1", "trainer.progress_bar=false", f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )  # fmt: skip
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("epoch 1/1:"))
    auc = float(re.search(r"val_auc=([0-9.]+)", line).group(1))
    assert auc >= 0.75, line


def test_cli_bad_files_give_one_line_exit_2_no_traceback(tmp_path):
    """One real process (each costs seconds of imports); every other bad input raises the same
    DataConfigError in-process (test_criteo_multihot.py), which the CLI prints the same way."""
    for day in (0, 1):
        np.save(tmp_path / f"day_{day}_dense.npy", np.zeros((64, 13), np.float32))
        np.save(tmp_path / f"day_{day}_labels.npy", np.zeros((64, 1), np.int32))
        members = {str(f): np.zeros((64, 1), np.int32) for f in range(8)}
        np.savez_compressed(tmp_path / f"day_{day}_sparse_multi_hot.npz", **members)
    proc = _start("data=criteo_multihot", f"data.path={tmp_path}", f"run_dir={tmp_path / 'r'}",
                  cwd=tmp_path)  # fmt: skip
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("rocmtrain: error:")]
    assert len(errors) == 1, err[-2000:]
    want = (
        f"rocmtrain: error: data.path: {tmp_path}/day_0_sparse_multi_hot.npz member 0.npy is "
        "compressed; the layout is memory-mapped and needs an uncompressed .npz: write it with "
        "numpy.savez (not savez_compressed)"
    )
    assert errors[0] == want
    assert not (tmp_path / "r").exists()  # a rejected command leaves no run dir

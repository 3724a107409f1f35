"""A full disk as a user meets it: ``python -m rocmtrain`` with its run dir on a real 1.2 MB
tmpfs (the first checkpoint does not fit). One error line naming the checkpoint and what to do,
exit 1, no per-log-record tracebacks, and no half-written checkpoint folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_is_one_error_line_and_no_half_checkpoint(small_disk):
    run_dir = small_disk / "run"
    p = subprocess.run(
        [sys.executable, "-m", "rocmtrain", f"run_dir={run_dir}", "trainer.max_epochs=1",
         "data.num_train_batches=4", "data.num_val_batches=1", "data.batch_size=64",
         "trainer.progress_bar=false"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-4000:]
    assert "step-000000004 not written" in errors[0] and "checkpoint.dir" in errors[0], errors
    assert "Traceback" not in p.stderr and "Logging error" not in p.stderr, p.stderr[-4000:]
    assert list((run_dir / "checkpoints").iterdir()) == []  # no temp, no partial folder

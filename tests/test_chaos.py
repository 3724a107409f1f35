"""The chaos harness (``scripts/chaos.py``) in its CI size: the real CLI on 2 gloo ranks under a
requeue loop meets one fault of each kind (SIGKILL and SIGSTOP of a rank, SIGTERM of the job,
ENOSPC during a save on a real tmpfs, a damaged checkpoint, the rendezvous port held at a
restart), survives every one, and ends bit for bit where the uninterrupted run of the same seed
ends: per-step loss of both ranks, every logged loss/grad-norm row, the final checkpoint's
tensors. A control checks that the comparison sees a one-bit difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


@pytest.mark.timeout(400)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for the ENOSPC fault: needs root")
def test_chaos_short_run_survives_one_fault_of_each_kind_bit_identical(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--faults", "6", "--short",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    text = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert (out / "chaos_report.json").is_file(), text
    report = json.loads((out / "chaos_report.json").read_text())
    assert proc.returncode == 0 and report["ok"], (report.get("error"), text)
    assert report["faults_injected"] >= 6 and report["faults_survived"] == report["faults_injected"]
    assert all(survived >= 1 for _, survived in report["by_kind"].values()), report["by_kind"]
    assert report["comparison"]["identical"], report["comparison"]
    csv = report["comparison"]["csv"]
    assert csv["steps"] == csv["ref_steps"] > 0 and not csv["mismatches"]

    # control: the same comparison on a copy of the final checkpoint with one bit of rank 1's
    # per-step loss record flipped must fail
    _flip_one_loss_bit(out / "checkpoints", rank=1)
    from chaos_compare import compare_runs

    doctored = compare_runs(
        out / "reference" / "checkpoints", out / "checkpoints", out / "reference", out / "run"
    )
    assert not doctored["identical"] and any(
        "rank 1 per-step loss" in p for p in doctored["problems"]
    )


def _flip_one_loss_bit(root: Path, *, rank: int) -> None:
    """Rewrite the newest checkpoint's rank file with one loss changed in its last bit (the
    marker's size is updated so the checkpoint still counts as complete)."""
    import struct

    import torch

    from rocmtrain import checkpoint as ckpt
    from rocmtrain.models.module import DLRMModule

    final = ckpt.list_checkpoints(root)[-1]
    part = torch.load(final / f"rank_{rank}.pt", weights_only=False)
    losses = part[DLRMModule.STEP_RECORD_KEY]["loss"]
    bits = struct.unpack("<Q", struct.pack("<d", losses[3]))[0] ^ 1
    losses[3] = struct.unpack("<d", struct.pack("<Q", bits))[0]
    torch.save(part, final / f"rank_{rank}.pt")
    marker = json.loads((final / ckpt.MARKER).read_text())
    marker["files"][f"rank_{rank}.pt"] = (final / f"rank_{rank}.pt").stat().st_size
    (final / ckpt.MARKER).write_text(json.dumps(marker))

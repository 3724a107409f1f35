"""SIGTERM → checkpoint → exit 75 → resume reproduces the uninterrupted loss curve exactly.

End to end through the real CLI: ``python -m rocmtrain recipe=dlrm_cpu`` (2 gloo ranks launched by
Lightning, TorchRec table-wise sharding, the foundation's atomic checkpoints, our callbacks).
Three runs with the same seed: uninterrupted; SIGTERM to rank 0 at step >= 12 (the ranks agree on
the step, checkpoint and exit 75); resumed from that checkpoint. Per-step losses (rank 0's CSV log)
of interrupted + resumed must equal the uninterrupted run's, bit for bit as logged.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocmtrain import checkpoint as ckpt
from rocmtrain import exit_codes

REPO = Path(__file__).resolve().parents[2]
# far more steps than the signal's step 12: an idle machine runs a CPU step in ~12 ms, and a
# SIGTERM that lands after the last step ends the run normally (exit 0, nothing to requeue)
STEPS = 160


def _cmd(run_dir: Path, ckpt_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rocmtrain",
        "recipe=dlrm_cpu",
        f"run_dir={run_dir}",
        f"checkpoint.dir={ckpt_dir}",
        "checkpoint.every_n_epochs=0",
        "trainer.max_epochs=1",
        f"data.num_train_batches={STEPS}",
        "data.num_val_batches=2",
        "data.batch_size=64",
        "trainer.log_every_n_steps=1",
        "trainer.progress_bar=false",
        "seed=7",
        "watchdog.heartbeat_channel=files",
        "watchdog.poll_interval_seconds=0.2",
    ]


def _losses(run_dir: Path) -> dict[int, str]:
    with open(run_dir / "logs" / "metrics.csv") as f:
        return {int(r["step"]): r["loss"] for r in csv.DictReader(f) if r.get("loss")}


def _rank0_step(run_dir: Path) -> int:
    beats = list((run_dir / "watchdog").glob("*/kv/hb/0"))
    if not beats:
        return -1
    try:
        return json.loads(beats[0].read_text())["step"]
    except (ValueError, OSError):
        return -1


def _run(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_sigterm_then_resume_reproduces_loss_curve(tmp_path: Path) -> None:
    ref_dir, int_dir, res_dir = tmp_path / "ref", tmp_path / "interrupted", tmp_path / "resumed"
    shared_ckpt = tmp_path / "ckpt"
    procs: list[subprocess.Popen] = []
    try:
        # the uninterrupted reference and the run to interrupt start together (wall time)
        ref = _run(_cmd(ref_dir, tmp_path / "ref_ckpt"), tmp_path / "ref.log")
        proc = _run(_cmd(int_dir, shared_ckpt), tmp_path / "int.log")
        procs += [ref, proc]
        deadline = time.monotonic() + 900
        while _rank0_step(int_dir) < 12:
            assert proc.poll() is None, (tmp_path / "int.log").read_text()[-5000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # rank 0 only: the ranks must still agree on the step
        assert proc.wait(timeout=300) == exit_codes.REQUEUE, (tmp_path / "int.log").read_text()[
            -5000:
        ]
        saved = ckpt.find_resume(shared_ckpt)
        assert saved is not None
        stopped_at = int(saved.name.split("-")[1])
        assert 12 <= stopped_at < STEPS
        first = _losses(int_dir)
        assert sorted(first) == list(range(stopped_at)), first

        res = _run(_cmd(res_dir, shared_ckpt), tmp_path / "res.log")
        procs.append(res)
        assert res.wait(timeout=900) == 0, (tmp_path / "res.log").read_text()[-5000:]
        assert ref.wait(timeout=900) == 0, (tmp_path / "ref.log").read_text()[-5000:]
        reference = _losses(ref_dir)
        assert sorted(reference) == list(range(STEPS)), reference
        second = _losses(res_dir)
        assert sorted(second) == list(range(stopped_at, STEPS)), second
        assert {**first, **second} == reference
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

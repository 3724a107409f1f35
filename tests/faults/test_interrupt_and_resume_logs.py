"""Ctrl-C and resume as a user meets them (real ``python -m rocmtrain`` processes, 2 gloo ranks).

- Ctrl-C (SIGINT to the terminal's process group, i.e. every rank) during training: the ranks agree,
  write a checkpoint, print "interrupted at step N" and exit 130; rerunning resumes from it.
- Resuming keeps the first attempt's ``logs/metrics.csv`` (Lightning's CSV logger would delete it);
  resuming into another model is refused in one line, the metrics left where they were.
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

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _ctrl_c_default() -> None:
    """Ctrl-C at its default action in the child, as in a terminal's foreground job (a shell
    starts background jobs, e.g. ``pytest ... &``, with SIGINT ignored, and children inherit it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmd(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "rocmtrain", f"run_dir={run_dir}", "data.num_train_batches=40",
        "data.num_val_batches=1", "data.batch_size=64", "trainer.progress_bar=false",
        "trainer.log_every_n_steps=1", "watchdog.heartbeat_channel=files", *extra,
    ]  # fmt: skip


def _run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _cmd(run_dir, *extra), cwd=REPO, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _steps(run_dir: Path) -> list[int]:
    """Each rank's last published training step (its watchdog heartbeat), -1 before the first."""
    steps = []
    for rank in (0, 1):
        beats = list(run_dir.glob(f"watchdog/*/kv/hb/{rank}"))
        try:
            steps.append(json.loads(beats[0].read_text())["step"] if beats else -1)
        except (OSError, ValueError):  # caught mid-write: read it again next time
            steps.append(-1)
    return steps


def test_ctrl_c_checkpoints_says_the_step_and_exits_130(tmp_path):
    run_dir = tmp_path / "run"
    log = open(tmp_path / "out.log", "w")
    proc = subprocess.Popen(  # 50 epochs x 40 steps: far longer than the wait below
        _cmd(run_dir, "trainer.max_epochs=50"), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
        preexec_fn=_ctrl_c_default,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while min(_steps(run_dir)) < 3:  # both ranks are training, a few steps in
        assert proc.poll() is None and time.monotonic() < deadline, _steps(run_dir)
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every rank gets it
    code = proc.wait(timeout=180)
    out = (tmp_path / "out.log").read_text()
    assert code == exit_codes.INTERRUPTED, out[-3000:]
    assert "rocmtrain: interrupted at step" in out, out[-3000:]
    found = ckpt.find_resume(run_dir / "checkpoints")
    assert found is not None and f"checkpoint: {found}" in out, out[-3000:]


def test_resume_keeps_the_previous_attempts_metrics(tmp_path):
    run_dir = tmp_path / "run"
    first = _run(run_dir, "trainer.max_epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    # each INFO line once on the console (rank 0's); rank 1's stay in its own log file
    console = first.stdout + first.stderr
    assert console.count("precision: mode=32 on cpu") == 1, console[-3000:]
    assert "precision: mode=32 on cpu" in (run_dir / "train_ddp_process_1.log").read_text()
    rows_first = list(csv.DictReader(open(run_dir / "logs" / "metrics.csv")))
    second = _run(run_dir, "trainer.max_epochs=2")  # resumes from the epoch-1 checkpoint
    assert second.returncode == 0, second.stderr[-3000:]
    kept = run_dir / "logs" / "metrics.attempt1.csv"
    assert list(csv.DictReader(open(kept))) == rows_first
    steps = [int(r["step"]) for r in csv.DictReader(open(run_dir / "logs" / "metrics.csv"))]
    assert steps and min(steps) >= max(int(r["step"]) for r in rows_first)  # continues, no restart

    # resuming into another embedding optimizer (its state has another shape; a changed table
    # size is covered in test_checkpoint): one line naming the tensor, both sizes and what to do,
    # exit 2, and the metrics where they were (the run never started)
    metrics = (run_dir / "logs" / "metrics.csv").read_text()
    third = _run(run_dir, "trainer.max_epochs=3", "model.embedding_optimizer=rowwise_adagrad")
    errors = [ln for ln in third.stderr.splitlines() if "error:" in ln]
    assert third.returncode == 2 and len(errors) == 1, third.stderr[-3000:]
    assert "momentum1 is [2000, 16] there, [2000] here" in errors[0], errors
    assert "checkpoint.resume=never" in errors[0] and "Traceback" not in third.stderr
    assert (run_dir / "logs" / "metrics.csv").read_text() == metrics
    assert not (run_dir / "logs" / "metrics.attempt2.csv").exists()

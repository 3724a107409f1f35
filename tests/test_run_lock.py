"""One run per run directory: while a run holds its folder (a real lock held by another process),
a second ``python -m rocmtrain`` on it ends with one error line before Hydra writes anything there,
and ``train``'s own run-dir preparation (the Python API) refuses it too; once the holder is gone,
the folder is free again (a requeued run resumes there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOLD = textwrap.dedent(
    """
    import sys, time
    from rocmtrain import run_lock
    assert run_lock.acquire(sys.argv[1]) is None
    print("held", flush=True)
    time.sleep(300)
    """
)


@pytest.fixture
def held(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_second_run_on_a_held_run_dir_is_refused_in_one_line(held):
    run_dir, holder = held
    p = subprocess.run(
        [sys.executable, "-m", "rocmtrain", f"run_dir={run_dir}", "trainer.max_epochs=1",
         "data.num_train_batches=4", "data.num_val_batches=1", "trainer.progress_bar=false"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"another run (pid {holder.pid})" in errors[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing of the second run


def test_train_refuses_a_held_run_dir_and_takes_it_once_free(held):
    from rocmtrain import run_lock
    from rocmtrain.config import ConfigError
    from rocmtrain.config.schema import RunConfig
    from rocmtrain.run_dirs import prepare_run_dir

    run_dir, holder = held
    with pytest.raises(ConfigError, match=f"another run \\(pid {holder.pid}\\)"):
        prepare_run_dir(RunConfig(run_dir=str(run_dir)))
    holder.kill()
    holder.wait()  # gone however it ended: the kernel released its lock
    assert prepare_run_dir(RunConfig(run_dir=str(run_dir))) == run_dir
    assert run_lock.holder(run_dir) is None  # this process holds it now

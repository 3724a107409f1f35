"""The new bench_e2e_gpu.sh stage scripts in their CPU smoke forms: the swap-in user module
(``swapin_user_module.py --cpu-smoke``) and the anchor's convergence run (``--fresh-epochs``),
then the summary over both."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(cmd: list[str], timeout: int = 500) -> subprocess.CompletedProcess[str]:
    """Run a stage script; on failure the assertion carries its exit status and output tail
    (a crash such as one SIGABRT seen once in a full-suite run then says where it was)."""
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    return out


@pytest.mark.slow
def test_swapin_and_fresh_anchor_smoke_then_summary(tmp_path):
    swap = tmp_path / "runs" / "swapin_1gpu_bf16"
    out = _run([sys.executable, str(BENCH / "swapin_user_module.py"), "--cpu-smoke",
                "--out-dir", str(swap)])  # fmt: skip
    assert "samples/s " in out.stdout.strip().splitlines()[-1]
    doc = json.loads((swap / "throughput.json").read_text())
    assert doc["final"] and doc["samples_per_s"] > 0 and doc["batch_per_rank"] == 256

    anchor = tmp_path / "anchor_1gpu_bf16_fresh.json"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
          str(BENCH / "e2e_torchrec_anchor.py"), "--cpu", "--global-batch", "128",
          "--rows-cap", "500", "--dim", "8", "--small-dense", "--bf16", "--warmup", "1",
          "--steps", "3", "--sync-every", "1", "--fresh-epochs", "2", "--val-batches", "1",
          "--workers", "0", "--out", str(anchor)])  # fmt: skip
    res = json.loads(anchor.read_text())
    assert len(res["step_losses"]) == 6  # 2 epochs x 3 new batches, every one trained
    assert [h["epoch"] for h in res["history"]] == [0.0, 1.0]
    assert all(0.0 <= h["val_auc"] <= 1.0 for h in res["history"])
    assert res["median_step_ms_windows"] > 0

    stages = [
        {"name": "anchor_1gpu_bf16_fresh", "kind": "anchor", "gpus": 1, "status": "ok",
         "result": str(anchor)},
        {"name": "swapin_1gpu_bf16", "kind": "swapin", "gpus": 1, "status": "ok",
         "result": str(swap / "throughput.json"), "run_dir": str(swap)},
    ]  # fmt: skip
    (tmp_path / "stages.jsonl").write_text("\n".join(json.dumps(s) for s in stages) + "\n")
    subprocess.run(
        [sys.executable, str(BENCH / "e2e_summary.py"), "--stages", str(tmp_path / "stages.jsonl"),
         "--out", str(tmp_path / "e2e"), "--mode", "cpu"],
        check=True, timeout=120,
    )  # fmt: skip
    md = (tmp_path / "e2e" / "summary.md").read_text()
    assert "| swapin_1gpu_bf16 | user module + strategy | 1 |" in md
    assert (tmp_path / "e2e" / "convergence.png").is_file()


def _bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    # the stages run with this interpreter (the script's default is `python` on PATH)
    env = {**_env(), "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(BENCH / "bench_e2e_gpu.sh"), "--cpu-smoke", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _stage_rows(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "stages.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_bench_continue_runs_what_the_budget_skipped_and_keeps_what_ran(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    only = ("--only", "anchor_1gpu_bf16_loader")
    # a budget too small for any stage: the stage is listed as skipped, nothing runs
    first = _bench("--out", str(out), "--work", str(work), "--budget-s", "20", *only)
    assert first.returncode == 0, first.stderr
    assert [(r["name"], r["status"]) for r in _stage_rows(work)] == [
        ("anchor_1gpu_bf16_loader", "skipped")
    ]

    second = _bench(
        "--out", str(out), "--work", str(work), "--continue", "--budget-s", "300", *only
    )
    assert second.returncode == 0, second.stderr
    rows = _stage_rows(work)
    log = work / "logs" / "anchor_1gpu_bf16_loader.log"
    assert [(r["name"], r["status"]) for r in rows] == [("anchor_1gpu_bf16_loader", "ok")], (
        log.read_text()[-2000:] if log.is_file() else second.stdout
    )
    assert json.loads(Path(rows[0]["result"]).read_text())["median_step_ms_windows"] > 0

    # a third invocation finds the stage done: it runs nothing and keeps the row
    third = _bench("--out", str(out), "--work", str(work), "--continue", "--budget-s", "300", *only)
    assert third.returncode == 0, third.stderr
    assert "start anchor_1gpu_bf16_loader" not in third.stdout
    assert _stage_rows(work) == rows
    assert "anchor_1gpu_bf16_loader" in (out / "e2e" / "summary.md").read_text()


def test_bench_continue_needs_the_work_dir_of_an_earlier_run(tmp_path):
    res = _bench("--out", str(tmp_path), "--work", str(tmp_path / "none"), "--continue", timeout=60)
    assert res.returncode == 2
    assert "--continue needs --work DIR" in res.stderr

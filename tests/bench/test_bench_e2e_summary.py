"""e2e_summary.py: ratios, scaling, AUC and missing stages from hand-written stage files."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_summary_tables_ratios_and_partial_runs(tmp_path):
    a1 = _write(
        tmp_path / "a1.json",
        {
            "samples_per_s": 1.0e6,
            "median_step_ms": 65.5,
            "peak_mem_gib": 40.0,
            "global_batch": 65536,
        },
    )
    rt1 = _write(
        tmp_path / "rt1.json",
        {
            "samples_per_s": 1.5e6,
            "step_ms_median": 43.7,
            "final": True,
            "global_batch": 65536,
            "peak_mem_alloc_gib_per_rank": [50.0],
            "history": [{"val_auc": 0.61, "train_auc": 0.55}, {"val_auc": 0.74, "train_auc": 0.7}],
        },
    )
    rt2 = _write(
        tmp_path / "rt2.json",
        {
            "samples_per_s": 2.7e6,
            "step_ms_median": 24.3,
            "final": False,
            "global_batch": 65536,
            "peak_mem_alloc_gib_per_rank": [30.0, 31.5],
            "history": [],
        },
    )
    stages = [
        {"name": "anchor_1gpu_bf16", "kind": "anchor", "gpus": 1, "status": "ok", "result": a1},
        {
            "name": "rt_1gpu_fbgemm_bf16",
            "kind": "rocmtrain",
            "gpus": 1,
            "status": "ok",
            "result": rt1,
        },
        {
            "name": "rt_2gpu_fbgemm_bf16",
            "kind": "rocmtrain",
            "gpus": 2,
            "status": "ok",
            "result": rt2,
        },
        {
            "name": "rt_1gpu_triton_bf16",
            "kind": "rocmtrain",
            "gpus": 1,
            "status": "timeout",
            "result": str(tmp_path / "missing.json"),
        },
    ]
    (tmp_path / "stages.jsonl").write_text("\n".join(json.dumps(s) for s in stages) + "\n")
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/bench/e2e_summary.py"),
            "--stages",
            str(tmp_path / "stages.jsonl"),
            "--out",
            str(out),
        ],
        check=True,
    )
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["rt_1gpu_fbgemm_bf16"]["vs_anchor"] == 1.5
    assert rows["rt_2gpu_fbgemm_bf16"]["scaling"] == 1.8
    assert rows["rt_2gpu_fbgemm_bf16"]["peak_mem_gib"] == 31.5
    assert rows["rt_2gpu_fbgemm_bf16"]["status"] == "partial"  # no final write: crashed later
    assert rows["rt_1gpu_triton_bf16"]["samples_per_s"] is None
    md = (out / "summary.md").read_text()
    assert "0.6100→0.7400" in md
    assert "2-GPU scaling 1.80x (target >= 1.85x): missed" in md
    assert "1.500 M samples/s vs 1.9 M target: missed" in md
    assert "| rt_1gpu_triton_bf16 | rocmtrain | 1 | triton | bf16 | sparse_dist | timeout | —" in md
    assert "| 0.5500→0.7000 |" in md

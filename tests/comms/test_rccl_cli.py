"""`python -m rocmtrain rccl-tests parse|run|sweep` end to end (real logs, real subprocesses)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from rccl_fakes import MI300X_LOG, write_fake

from rocmtrain.comms.rccl import plan_rccl_env
from rocmtrain.comms.rccl_tests.cli import main
from rocmtrain.config.rccl import RcclConfig


@pytest.mark.parametrize(
    "name, code",
    [
        ("rccl-tests_allreduce_mi300x_1.txt", 0),
        ("rccl-tests_allgather_mi250x_multinode_5.txt", 0),
        ("rccl-tests_allreduce_failed_init_4.txt", 1),
        ("nccl-tests_allreduce_failed_midrun_8.txt", 1),
        ("nccl-tests_allgather_oob_failed_10.txt", 1),
    ],
)
def test_parse_json_schema_and_exit_code(fixtures_dir: Path, capsys, name: str, code: int) -> None:
    rc = main(["parse", str(fixtures_dir / "rccl_tests" / name), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == code and doc["ok"] is (code == 0)
    assert set(doc) == {"ok", "collective", "ranks", "rows", "avg_busbw_gbps", "errors"}
    assert bool(doc["errors"]) is (code != 0)
    for row in doc["rows"]:
        assert set(row) == {
            "size_bytes",
            "count",
            "type",
            "redop",
            "root",
            "out_of_place",
            "in_place",
        }
        for blk in (row["out_of_place"], row["in_place"]):
            assert blk is None or set(blk) == {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}


def test_parse_text_output_and_reason(fixtures_dir: Path, capsys) -> None:
    rc = main(
        ["parse", str(fixtures_dir / "rccl_tests" / "nccl-tests_allgather_oob_failed_10.txt")]
    )
    cap = capsys.readouterr()
    assert rc == 1 and "4294967296" in cap.out and "129.05" in cap.out
    assert "validation failed: Out of bounds values : 2" in cap.err


def test_parse_floor_option(fixtures_dir: Path, capsys) -> None:
    log = str(fixtures_dir / "rccl_tests" / MI300X_LOG)
    assert main(["parse", log, "--min-busbw", "250", "--floor-min-bytes", "64M"]) == 0
    assert main(["parse", log, "--min-busbw", "280", "--floor-min-bytes", "64M"]) == 1
    assert "below the floor 280 GB/s" in capsys.readouterr().err


def test_bad_input(tmp_path: Path, fixtures_dir: Path, capsys) -> None:
    assert main(["parse", str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
    garbled = tmp_path / "garbled.log"
    garbled.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary junk\n")
    assert main(["parse", str(garbled), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    trunc = tmp_path / "trunc.log"
    text = (fixtures_dir / "rccl_tests" / MI300X_LOG).read_text()
    trunc.write_text(text[: text.index("   152.7")])
    assert main(["parse", str(trunc)]) == 1
    assert "incomplete" in capsys.readouterr().err
    bad_json = tmp_path / "r.json"
    bad_json.write_text("{not json")
    assert main(["parse", str(bad_json)]) == 1
    assert "cannot parse" in capsys.readouterr().err
    assert main(["parse"]) == 2
    assert main(["sweep", "--out", str(tmp_path), "--protocols", "LL64"]) == 2
    assert "unknown token 'LL64'" in capsys.readouterr().err
    assert main(["run", "all_reduce", "--tests-dir", str(tmp_path), "--env", "RCCL_PROTO=LL"]) == 2
    assert "use NCCL_PROTO" in capsys.readouterr().err


def test_run_missing_binary(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("RCCL_TESTS_DIR", raising=False)
    assert main(["run", "alltoall", "--tests-dir", str(tmp_path)]) == 2
    assert "alltoall_perf not found" in capsys.readouterr().err


def test_run_hang_via_cli(tmp_path: Path, fixtures_dir: Path, capsys) -> None:
    write_fake(
        tmp_path, "all_reduce_perf", fixture=fixtures_dir / "rccl_tests" / MI300X_LOG, mode="hang"
    )
    rc = main(["run", "all_reduce", "--tests-dir", str(tmp_path), "--timeout", "3"])
    assert rc == 1 and "hung: no exit after 3 s" in capsys.readouterr().err


def test_module_entry_point(fixtures_dir: Path, capsys) -> None:
    """The `python -m rocmtrain rccl-tests parse` dispatch (rocmtrain.__main__), in process."""
    from rocmtrain.__main__ import main as rocmtrain_main

    log = fixtures_dir / "rccl_tests" / "rccl-tests_allreduce_failed_init_4.txt"
    assert rocmtrain_main(["rccl-tests", "parse", str(log)]) == 1
    assert "invalid kernel file" in capsys.readouterr().err


def test_sweep_end_to_end(tmp_path: Path, fixtures_dir: Path, capsys, monkeypatch) -> None:
    log = fixtures_dir / "rccl_tests" / MI300X_LOG
    bins = tmp_path / "bin"
    scale = {"Simple": 1.25, "LL": 0.5}
    for coll in ("all_reduce", "alltoall"):
        write_fake(bins, f"{coll}_perf", fixture=log, proto_scale=scale, fail_protocols=("LL128",))
    monkeypatch.setenv("NCCL_PROTO", "LL")  # must not leak into the "unset" baseline
    out = tmp_path / "out"
    rc = main(["sweep", "--tests-dir", str(bins), "--collectives", "all_reduce,alltoall",
               "--protocols", "unset,LL,Simple,LL128", "--algorithms", "unset,Ring",
               "--out", str(out), "--preset-name", "h200_measured", "--timeout", "60",
               "--env", "NCCL_NVLS_ENABLE=0"])  # fmt: skip
    assert rc == 1  # the LL128 runs failed: reported, not hidden
    assert "FAILED: 4 of 16 runs failed" in capsys.readouterr().err
    table = (out / "sweep.md").read_text()
    assert "| 134217728 | 293.07 |" in table  # baseline = the real log's value
    assert "366.34" in table  # Simple: 293.07 * 1.25
    assert "Failed runs:" in table and "Test NCCL failure" in table
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "sweep.json").read_text())
    assert len(data["runs"]) == 2 * 8
    baseline = [
        r
        for r in data["runs"]
        if r["setting"] == {"protocol": None, "algorithm": None, "channels": None}
    ]
    assert baseline and all("NCCL_PROTO" not in r["env"] for r in baseline)
    calls = [json.loads(x) for x in (bins / "all_reduce_perf.calls").read_text().splitlines()]
    assert sum(1 for c in calls if "NCCL_PROTO" not in c["env"]) == 2  # unset × {unset, Ring}
    assert all(c["env"].get("NCCL_NVLS_ENABLE") == "0" for c in calls)
    assert {c["env"].get("NCCL_ALGO") for c in calls} == {None, "Ring"}
    preset = out / "h200_measured.yaml"
    cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(RcclConfig), OmegaConf.load(preset))
    )
    assert cfg.protocol == "Simple"
    assert plan_rccl_env(cfg, collective_only=True)["NCCL_PROTO"] == "Simple"
    assert "# scores" in preset.read_text()
    for path in (out / "logs").iterdir():
        assert path.stat().st_size > 0


def test_sweep_keeps_baseline_when_nothing_wins(tmp_path: Path, fixtures_dir: Path) -> None:
    bins = tmp_path / "bin"
    write_fake(bins, "all_reduce_perf", fixture=fixtures_dir / "rccl_tests" / MI300X_LOG,
               proto_scale={"Simple": 1.01})  # fmt: skip
    out = tmp_path / "out"
    rc = main(["sweep", "--tests-dir", str(bins), "--collectives", "all_reduce",
               "--protocols", "Simple", "--algorithms", "unset", "--out", str(out)])  # fmt: skip
    assert rc == 0
    preset = OmegaConf.load(out / "measured.yaml")
    assert len(preset) == 0  # baseline added automatically; +1% is under the 3% margin
    assert os.path.getsize(out / "sweep.png") > 1000


def test_sweep_on_time_metric(tmp_path: Path, fixtures_dir: Path) -> None:
    """One GPU: busbw is 0 by definition, so the sweep compares times (lower is better)."""
    bins = tmp_path / "bin"
    write_fake(bins, "all_reduce_perf", fixture=fixtures_dir / "rccl_tests" / MI300X_LOG,
               proto_scale={"LL": 2.0, "Simple": 0.5})  # fmt: skip
    out = tmp_path / "out"
    args = ["sweep", "--tests-dir", str(bins), "--collectives", "all_reduce", "--protocols",
            "unset,LL,Simple", "--out", str(out), "--metric", "time", "--algorithms", "unset"]  # fmt: skip
    assert main(args) == 0
    table = (out / "sweep.md").read_text()
    assert "### all_reduce: time us (out-of-place)" in table
    assert "| 8 | 45.92 | 22.96 | 91.84 |" in table  # the real 8-byte time, halved and doubled
    assert "| proto=LL | 2.000 |" in table and "| proto=Simple | 0.500 |" in table
    assert OmegaConf.load(out / "measured.yaml").protocol == "LL"


def test_run_with_json_file(tmp_path: Path, fixtures_dir: Path, capsys) -> None:
    write_fake(tmp_path, "all_reduce_perf", fixture=fixtures_dir / "rccl_tests" / MI300X_LOG,
               help_style="nccl")  # fmt: skip
    rc = main(
        [
            "run",
            "all_reduce",
            "--tests-dir",
            str(tmp_path),
            "--output-file",
            str(tmp_path / "o.json"),
        ]
    )
    assert rc == 0
    assert "json output: " in capsys.readouterr().err and (tmp_path / "o.json").is_file()

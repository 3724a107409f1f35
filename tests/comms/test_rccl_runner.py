"""The rccl-tests runner against real subprocesses: fake *_perf executables printing real logs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rccl_fakes import MI300X_LOG, pid_alive, write_fake

from rocmtrain.comms.rccl_tests.runner import (
    RunSpec,
    build_command,
    find_binary,
    output_support,
    parse_size,
    read_output_file,
    run_test,
)


@pytest.fixture()
def log(fixtures_dir: Path) -> Path:
    return fixtures_dir / "rccl_tests" / MI300X_LOG


def test_healthy_run(tmp_path: Path, log: Path) -> None:
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=log)
    spec = RunSpec(min_bytes=8, max_bytes=128 << 20, gpus_per_proc=8, binary_timeout_s=30)
    cmd = build_command(fake, spec)
    out = run_test(cmd, timeout_s=60, env={**os.environ, "NCCL_PROTO": "Simple"},
                   log_path=tmp_path / "run.log")  # fmt: skip
    assert out.ok, out.errors
    assert out.returncode == 0 and not out.timed_out
    assert len(out.parsed.rows) == 25 and out.parsed.rows[-1].out_of_place.busbw_gbps == 293.07
    assert (tmp_path / "run.log").read_text() == out.output
    call = json.loads((tmp_path / "all_reduce_perf.calls").read_text().splitlines()[0])
    argv = call["argv"]
    assert argv[argv.index("-g") + 1] == "8" and argv[argv.index("-T") + 1] == "30"
    assert argv[argv.index("-e") + 1] == str(128 << 20)
    assert call["env"]["NCCL_PROTO"] == "Simple"


def test_hang_kills_the_whole_process_group(tmp_path: Path, log: Path) -> None:
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=log, mode="hang")
    t0 = time.monotonic()
    out = run_test([str(fake), "-b", "8"], timeout_s=4, grace_s=2)
    assert time.monotonic() - t0 < 15
    assert out.timed_out and not out.ok
    assert out.errors[0].startswith("hung: no exit after 4 s")
    assert any("incomplete" in e for e in out.errors)
    child = int((tmp_path / "all_reduce_perf.child").read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(child), "the grandchild survived: the process group was not killed"


def test_nonzero_exit_after_partial_output(tmp_path: Path, log: Path) -> None:
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=log, mode="truncate", exit_code=1)
    out = run_test([str(fake)], timeout_s=30)
    assert out.returncode == 1 and not out.ok
    assert out.errors[0] == "all_reduce_perf exited with code 1"
    assert any("incomplete" in e for e in out.errors) and out.parsed.rows


def test_nonzero_exit_even_with_a_complete_log(tmp_path: Path, log: Path) -> None:
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=log, exit_code=1)
    out = run_test([str(fake)], timeout_s=30)
    assert out.errors == ["all_reduce_perf exited with code 1"]


def test_failure_trailer(tmp_path: Path, fixtures_dir: Path) -> None:
    midrun = fixtures_dir / "rccl_tests" / "nccl-tests_allreduce_failed_midrun_8.txt"
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=midrun, exit_code=2)
    out = run_test([str(fake)], timeout_s=30)
    assert out.errors[0] == "all_reduce_perf exited with code 2"
    assert any("Test NCCL failure common.cu:392" in e for e in out.errors)


def test_missing_program_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    out = run_test([str(tmp_path / "nope_perf")], timeout_s=5)
    assert not out.ok and "cannot start" in out.errors[0]


def test_find_binary_order(tmp_path: Path, log: Path) -> None:
    a = write_fake(tmp_path / "cfg", "all_gather_perf", fixture=log)
    b = write_fake(tmp_path / "envdir" / "build", "all_gather_perf", fixture=log)
    c = write_fake(tmp_path / "onpath", "all_gather_perf", fixture=log)
    env = {"RCCL_TESTS_DIR": str(tmp_path / "envdir"), "PATH": str(tmp_path / "onpath")}
    assert find_binary("all_gather", search_dirs=[tmp_path / "cfg"], environ=env) == a.resolve()
    assert find_binary("all_gather", environ=env) == b.resolve()
    assert find_binary("all_gather", environ={"PATH": env["PATH"]}) == c
    with pytest.raises(FileNotFoundError, match="all_reduce_perf not found.*RCCL_TESTS_DIR"):
        find_binary("all_reduce", environ=env)
    with pytest.raises(ValueError, match="choose one of"):
        find_binary("allreduce", environ=env)


def test_launchers_build_argument_lists() -> None:
    spec = RunSpec(min_bytes=parse_size("1K"), max_bytes=parse_size("1G"), check=0)
    local = build_command("/x/alltoall_perf", spec)
    assert local[:5] == ["/x/alltoall_perf", "-b", "1024", "-e", str(1 << 30)]
    assert "-T" not in local and local[local.index("-c") + 1] == "0"
    srun = build_command("/x/alltoall_perf", spec, launcher="srun", nprocs=16)
    assert srun[:3] == ["srun", "--ntasks=16", "--label"] and srun[3:] == local
    mpi = build_command(
        "/x/alltoall_perf", spec, launcher="mpirun", nprocs=2, launcher_args=["-x", "NCCL_DEBUG"]
    )
    assert mpi == ["mpirun", "-np", "2", "--tag-output", "-x", "NCCL_DEBUG", *local]
    with pytest.raises(ValueError, match="use srun or mpirun"):
        build_command("/x/a", spec, nprocs=2)
    with pytest.raises(ValueError, match="min_bytes"):
        build_command("/x/a", RunSpec(min_bytes=10, max_bytes=1))


def test_parse_size() -> None:
    assert [parse_size(s) for s in ("8", "64K", "256M", "4G", "1.5K")] == [
        8,
        65536,
        1 << 28,
        1 << 32,
        1536,
    ]
    for bad in ("", "abc", "-1", "0"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


@pytest.mark.parametrize("style, fmt", [("nccl", "json"), ("rccl", "csv"), (None, None)])
def test_machine_readable_output(tmp_path: Path, log: Path, style, fmt) -> None:
    fake = write_fake(tmp_path, "all_reduce_perf", fixture=log, help_style=style)
    assert output_support(fake) == fmt
    if fmt is None:
        return
    out_file = tmp_path / f"r.{fmt}"
    cmd = build_command(fake, RunSpec(output_file=str(out_file), output_format=fmt))
    assert (
        cmd[-2:] == ["-J", str(out_file)]
        if fmt == "json"
        else cmd[-4:] == ["-x", str(out_file), "-Z", "csv"]
    )
    out = run_test(cmd, timeout_s=30)
    assert out.ok
    other = read_output_file(out_file, fmt)
    assert [r.size_bytes for r in other.rows] == [r.size_bytes for r in out.parsed.rows]
    assert other.rows[-1].in_place.busbw_gbps == 289.60 and other.rows[-1].out_of_place.wrong == 0
    bad = read_output_file(tmp_path / "missing.json", "json")
    assert bad.parse_errors and "cannot read json output" in bad.parse_errors[0]
    with pytest.raises(ValueError, match="output_format"):
        build_command(fake, RunSpec(output_file="x"))

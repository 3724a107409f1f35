"""scripts/bench/trace_gaps.py on a small chrome trace written here: two GPU streams whose work
overlaps, one 50 us idle gap ended by a kernel that a named op launched, one blocking
synchronize; the idle time, its attribution and the blocking call are read back exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid,
            "args": args}  # fmt: skip


def test_trace_gaps_attributes_idle_time(tmp_path):
    import trace_gaps

    ev = [
        _x("user_annotation", "ProfilerStep#7", 0, 1000),
        _x("gpu_user_annotation", "ProfilerStep#7", 100, 400, tid=7),  # not a step of its own
        _x("user_annotation", "_TBEFunctionBackward", 300, 100),
        _x("cpu_op", "aten::sort", 320, 30),
        _x("cuda_runtime", "cudaLaunchKernel", 330, 5, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=3),
        _x("cuda_runtime", "cudaStreamSynchronize", 600, 250),
        _x("kernel", "dense_gemm", 100, 200, tid=7, correlation=1),  # busy 100-300
        _x("gpu_memcpy", "Memcpy HtoD", 250, 100, tid=9, correlation=3),  # overlaps: to 350
        _x("kernel", "radix_sort", 400, 100, tid=7, correlation=2),  # gap 350-400
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    out = tmp_path / "gaps.json"
    assert trace_gaps.main([str(path), "--min-gap-us", "10", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    (step,) = res["steps"]
    assert step["busy_us"] == 350.0 and step["idle_us"] == 650.0
    (gap,) = step["gaps"]
    assert gap == {"gap_us": 50.0, "next": "radix_sort", "launched_by": "_TBEFunctionBackward",
                   "launch_to_start_us": 70.0}  # fmt: skip
    assert res["idle_by_launching_op_us_per_step"] == {"_TBEFunctionBackward": 50.0}
    assert res["blocking_host_calls_per_step"] == {
        "cudaStreamSynchronize": {"us": 250.0, "calls": 1.0}
    }


def test_trace_gaps_kernels_name_their_launching_op(tmp_path):
    import trace_gaps

    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 1000),
        _x("user_annotation", "ProfilerStep#2", 1000, 1000),
        _x("user_annotation", "## Call CompiledFxGraph abc ##", 100, 50),
        _x("cuda_runtime", "cudaGraphLaunch", 110, 5, correlation=1),
        _x("user_annotation", "_TBEFunctionBackward", 1200, 100),
        _x("cuda_runtime", "cudaLaunchKernel", 1210, 5, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 1250, 5, correlation=3),
        _x("kernel", "triton_poi_fused_add_mul_0", 200, 300, tid=7, correlation=1),
        _x("kernel", "radix_sort", 1300, 40, tid=7, correlation=2),
        _x("kernel", "radix_sort", 1400, 60, tid=7, correlation=3),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    out = tmp_path / "k.json"
    assert trace_gaps.main([str(path), "--kernels", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["kernels"]
    assert rows == [
        {"kernel": "triton_poi_fused_add_mul_0",
         "launched_by": "cudaGraphLaunch @ ## Call CompiledFxGraph abc ##",
         "us_per_step": 150.0, "calls_per_step": 0.5},
        {"kernel": "radix_sort", "launched_by": "cudaLaunchKernel @ _TBEFunctionBackward",
         "us_per_step": 50.0, "calls_per_step": 1.0},
    ]  # fmt: skip

"""The profile's kernels table on real ``FunctionEvent`` records: device work only, summed by name."""

from __future__ import annotations

from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from rocmtrain.callbacks.profiling import _kernel_rows, device_work, step_timeline


def _ev(i: int, name: str, a: float, b: float, *, dev: bool, range_: bool = False) -> FunctionEvent:
    return FunctionEvent(
        id=i,
        name=name,
        thread=0,
        start_us=a,
        end_us=b,
        device_type=DeviceType.CUDA if dev else DeviceType.CPU,
        is_user_annotation=range_,
    )


def _window() -> list[FunctionEvent]:
    return [
        _ev(0, "ProfilerStep#1", 0, 1000, dev=False),
        _ev(1, "aten::mm", 10, 20, dev=False),  # the host op that launched gemm_a
        _ev(2, "Optimizer.step#Adagrad.step", 100, 900, dev=True, range_=True),  # GPU-side range
        _ev(3, "gemm_a", 100, 400, dev=True),
        _ev(4, "gemm_a", 500, 600, dev=True),
        _ev(5, "Memcpy HtoD (Pinned -> Device)", 300, 450, dev=True),  # overlaps gemm_a by 100
        _ev(6, "ProfilerStep#1", 0, 1000, dev=True, range_=True),
    ]


def test_only_kernels_copies_and_memsets_are_device_work() -> None:
    names = sorted(e.name for e in device_work(_window()))
    assert names == ["Memcpy HtoD (Pinned -> Device)", "gemm_a", "gemm_a"]


def test_rows_sum_by_name_largest_first() -> None:
    rows = _kernel_rows(_window())
    assert [(r["name"], r["calls"]) for r in rows] == [
        ("gemm_a", 2),
        ("Memcpy HtoD (Pinned -> Device)", 1),
    ]
    assert abs(rows[0]["self_ms"] - 0.4) < 1e-9 and abs(rows[1]["self_ms"] - 0.15) < 1e-9


def test_timeline_busy_is_the_union_and_kernels_the_sum() -> None:
    t = step_timeline(_window())
    (step,) = t["steps"]
    assert abs(step["wall_ms"] - 1.0) < 1e-9
    assert abs(step["device_busy_ms"] - 0.45) < 1e-9  # 100-450 and 500-600
    assert abs(step["device_kernel_ms"] - 0.55) < 1e-9  # the 100 us overlap counted twice


def test_step_budget_splits_embedding_dense_overlap_and_idle() -> None:
    window = _window() + [
        # FBGEMM's TBE backward on a side stream, 50 us of it under gemm_a's second call
        _ev(7, "split_embedding_backward_codegen_rowwise_adagrad_kernel", 550, 700, dev=True),
    ]
    (step,) = step_timeline(window)["steps"]
    b = step["budget"]
    assert abs(b["embedding_ms"] - 0.15) < 1e-9
    assert abs(b["dense_ms"] - 0.55) < 1e-9  # gemm_a twice and the copy
    # the copy under gemm_a (100 us) and the TBE under gemm_a (50 us)
    assert abs(b["overlap_ms"] - 0.15) < 1e-9
    assert abs(b["idle_ms"] - (1.0 - 0.55)) < 1e-9  # busy 100-450 and 500-700
    assert abs(step["device_busy_ms"] - 0.55) < 1e-9

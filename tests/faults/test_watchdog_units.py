"""Pure pieces of the watchdog area: hints on real error text, hang classification, config,
heartbeat records and channels, process liveness; and two-phase timeouts on a real gloo group."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import wd_worker
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rocmtrain.config import ConfigError
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.faults import hang_report as hr
from rocmtrain.faults.heartbeat import FileKV, Heartbeat, Progress, pid_alive
from rocmtrain.faults.hints import hint_for, hint_for_exception

REPO = Path(__file__).resolve().parents[2]

# -- hints: lines as published (source in the comment), or produced live by this torch ------------

# (PyTorch ProcessGroupNCCL watchdog line, also printed for RCCL)
WATCHDOG_LINE = (
    "[Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4486, OpType=ALLTOALL, "
    "NumelIn=8388608, NumelOut=8388608, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."
)
# https://github.com/hiyouga/LlamaFactory/issues/7396 (with the [rankN]:[E...] log prefix)
WATCHDOG_PREFIXED = (
    "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
    "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)
# https://github.com/mila-iqia/milabench/pull/269 (wrapped by the log collector after "timeout:")
WATCHDOG_WRAPPED = (
    "dinov2-giant-nodes.cn-d004 [stderr] [rank14]:[E909 09:55:29.307629539 ProcessGroupNCCL.cpp:607] "
    "[Rank 14] Watchdog caught collective operation timeout: \nWorkNCCL(SeqNum=2070, OpType=REDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600034 milliseconds before timing out."
)
# https://github.com/zai-org/CogVLM2/issues/178
NCCL_SYSTEM_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
    "version 2.19.3 ncclSystemError: System call (e.g. socket, malloc) or external library call "
    "failed or device error."
)
# https://github.com/horovod/horovod/issues/1651
COMM_INIT_FAILED = "tensorflow.python.framework.errors_impl.UnknownError:  ncclCommInitRank failed: unhandled system error"
# https://github.com/pytorch/pytorch/issues/147626
INVALID_DEVICE_FUNCTION = (
    "RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging "
    "consider passing AMD_SERIALIZE_KERNEL=3\nCompile with TORCH_USE_HIP_DSA to enable device-side assertions."
)
# https://github.com/ROCm/tensorflow-upstream/issues/1800
NO_BINARY = '"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"'
# https://github.com/kyuz0/amd-strix-halo-image-video-toolboxes/issues/3
HIP_OOM = (
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.31 GiB. GPU 0 has a total "
    "capacity of 128.00 GiB of which 780.24 MiB is free. Of the allocated memory 57.70 GiB is "
    "allocated by PyTorch, and 75.82 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to "
    "avoid fragmentation."
)
# torch 2.13 gloo, recorded in this repo (tests/faults: a peer SIGKILLed mid all_reduce)
GLOO_PEER_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:45953. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error."
)


def test_hint_collective_timeout_parses_rank_op_and_times() -> None:
    h = hint_for(WATCHDOG_LINE)
    assert h is not None and h.kind == "collective_timeout" and h.requeue
    assert h.details == {
        "rank": "7",
        "seq": "4486",
        "op": "ALLTOALL",
        "timeout_ms": "600000",
        "ran_ms": "600013",
    }
    h2 = hint_for(WATCHDOG_PREFIXED)
    assert h2 is not None and (h2.details["rank"], h2.details["op"], h2.details["seq"]) == (
        "0",
        "ALLREDUCE",
        "1580",
    )
    assert "torchfrtrace" in h2.render() and "rccl.train_timeout_seconds" in h2.render()
    h3 = hint_for(WATCHDOG_WRAPPED)
    assert h3 is not None and (h3.details["rank"], h3.details["op"], h3.details["seq"]) == (
        "14",
        "REDUCE",
        "2070",
    )


def test_hint_comm_init_failures() -> None:
    h = hint_for(NCCL_SYSTEM_ERROR)
    assert h is not None and h.kind == "comm_init" and h.details["nccl_version"] == "2.19.3"
    assert "NCCL_SOCKET_IFNAME" in h.render()
    # RCCL >= 2.21.5 picks the RoCE v2 GID itself: the hint says when to set one, never "=3"
    assert "ib_gid_index=3" not in h.render() and "2.21.5" in h.render()
    assert hint_for(COMM_INIT_FAILED).kind == "comm_init"


def test_hint_arch_mismatch_on_real_rccl_init_failure(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "rccl_tests" / "rccl-tests_allreduce_failed_init_4.txt").read_text()
    h = hint_for(text)  # "NCCL WARN Cuda failure 'invalid kernel file'" (RCCL issue 876)
    assert h is not None and h.kind == "arch_mismatch" and not h.requeue
    assert "PYTORCH_ROCM_ARCH" in h.render() and "ROCR_VISIBLE_DEVICES" in h.render()
    for line in (INVALID_DEVICE_FUNCTION, NO_BINARY):
        assert hint_for(line).kind == "arch_mismatch"


def test_hint_out_of_memory_extracts_sizes() -> None:
    h = hint_for(HIP_OOM)
    assert h is not None and h.kind == "out_of_memory" and not h.requeue
    assert h.details == {
        "device": "HIP",
        "tried": "3.31 GiB",
        "gpu": "0",
        "capacity": "128.00 GiB",
        "free": "780.24 MiB",
        "allocated_by_pytorch": "57.70 GiB",
    }
    assert "expandable_segments" in h.render() and "PyTorch >= 2.12" in h.render()


def test_hint_peer_gone_and_unknown_text() -> None:
    assert hint_for(GLOO_PEER_CLOSED).kind == "peer_gone"
    assert hint_for("ValueError: shapes (3,) and (4,) not aligned") is None
    assert hint_for_exception(ValueError("bad shape")) is None


def test_hint_for_exception_follows_the_chain() -> None:
    try:
        try:
            raise RuntimeError(HIP_OOM)
        except RuntimeError as inner:
            raise ValueError("while building the model") from inner
    except ValueError as outer:
        h = hint_for_exception(outer)
    assert h is not None and h.kind == "out_of_memory"


def test_hint_store_timeout_on_a_real_tcpstore() -> None:
    port = wd_worker.free_port()
    with pytest.raises(dist.DistStoreError) as err:
        dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=1), wait_for_workers=True)
    h = hint_for_exception(err.value)
    assert h is not None and h.kind == "store_timeout"
    assert (h.details["joined"], h.details["world"]) == ("1", "2")


# -- hang classification (pure) --------------------------------------------------------------------


def _hb(rank: int, step: int, in_step: int, phase: str, **kw) -> Heartbeat:
    base = dict(
        collective="",
        seq=step * 10 + in_step,
        wall_time=0.0,
        timeout_s=3.0,
        pid=100 + rank,
        host="h",
        pid_ns="",
    )
    return Heartbeat(rank=rank, step=step, beat_in_step=in_step, phase=phase, **{**base, **kw})


def test_classify_names_the_rank_behind() -> None:
    beats = {
        0: _hb(0, 7, 2, "all_reduce"),
        1: _hb(1, 7, 1, "forward"),
        2: _hb(2, 7, 2, "all_reduce"),
    }
    d = hr.classify(beats, world_size=3, dead=set(), stale={0, 1, 2})
    assert (d["cause"], d["stuck_ranks"]) == ("stall", [1])
    assert "step 7" in d["summary"] and "'forward'" in d["summary"]
    # a rank one whole step behind is behind even with more beats in its step
    beats[2] = _hb(2, 6, 5, "backward")
    assert hr.classify(beats, world_size=3, dead=set(), stale=set())["stuck_ranks"] == [2]


def test_classify_all_equal_dead_failed_missing() -> None:
    same = {r: _hb(r, 3, 4, "all_to_all") for r in range(4)}
    d = hr.classify(same, world_size=4, dead=set(), stale=set())
    assert d["stuck_ranks"] == [0, 1, 2, 3] and "same point" in d["summary"]
    assert hr.classify(same, world_size=4, dead={2}, stale=set())["cause"] == "peer_exited"
    same[3] = _hb(3, 3, 5, "failed:OutOfMemoryError")
    d = hr.classify(same, world_size=4, dead=set(), stale=set())
    assert (d["cause"], d["stuck_ranks"]) == ("peer_failed", [3])
    del same[3]
    assert hr.classify(same, world_size=4, dead=set(), stale=set())["stuck_ranks"] == [3]
    finished = {0: _hb(0, 9, 0, "finished"), 1: _hb(1, 8, 3, "backward")}
    assert hr.classify(finished, world_size=2, dead=set(), stale={1})["stuck_ranks"] == [1]


def test_report_json_and_text(tmp_path: Path) -> None:
    beats = {0: _hb(0, 5, 2, "all_reduce", collective="all_reduce"), 1: _hb(1, 5, 1, "forward")}
    stacks = tmp_path / "stacks_rank_1.txt"
    hr.dump_stacks(stacks)
    decision = hr.classify(beats, world_size=2, dead=set(), stale={1})
    report = hr.build_report(
        decision=decision,
        beats=beats,
        stale_s={0: 3.2, 1: 3.4},
        dumps={0: {}, 1: {"stacks_file": str(stacks)}},
        notes={},
        world_size=2,
        declared_by=0,
        timeout_s=3.0,
        attempt="a",
        backend="gloo",
        fr_files=[],
    )
    path = hr.write_report(report, attempt_dir=tmp_path / "a", run_dir=tmp_path)
    back = json.loads(path.read_text())
    assert back["stuck_ranks"] == [1] and back["stuck_steps"] == {"1": 5}
    assert json.loads((tmp_path / "hang_report.json").read_text()) == back
    text = (tmp_path / "hang_report.txt").read_text()
    assert (
        "stuck rank(s): [1]" in text and "test_report_json_and_text" in text
    )  # this thread's stack


# -- config -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hang_timeout_seconds", 0),
        ("poll_interval_seconds", 200.0),
        ("heartbeat_channel", "nccl"),
        ("learn_safety_factor", 1.0),
        ("exit_code", 300),
        ("preemption_signals", ["SIGKILL"]),
        ("preemption_signals", ["SIGTERMM"]),
        ("first_step_timeout_seconds", -1.0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"watchdog.{field}"):
        WatchdogConfig(**{field: value})


@pytest.mark.parametrize("preset", ["default", "strict", "files", "off"])
def test_presets_compose_into_the_schema(preset: str) -> None:
    with initialize_config_dir(config_dir=str(REPO / "configs" / "watchdog"), version_base="1.3"):
        raw = compose(config_name=preset)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WatchdogConfig), raw))
    assert isinstance(cfg, WatchdogConfig)
    cfg.validate()
    expected = {
        "default": ("tcpstore", True),
        "strict": ("tcpstore", True),
        "files": ("files", True),
        "off": ("tcpstore", False),
    }
    assert (cfg.heartbeat_channel, cfg.enabled) == expected[preset]


# -- heartbeat records, learned timeout, channels, liveness -----------------------------------------


def test_progress_orders_beats_and_learns_timeout() -> None:
    p = Progress()
    p.beat("forward", step=0)
    p.beat("backward")
    seq, step, in_step, phase, _, _ = p.state
    assert (seq, step, in_step, phase) == (2, 0, 2, "backward")
    for _ in range(5):
        time.sleep(0.01)
        p.step_done()
    assert p.state[1] == 5 and p.state[2] == 0
    assert p.learned_timeout(factor=10, floor_s=1.0, ceiling_s=300, min_steps=10) is None
    got = p.learned_timeout(factor=10, floor_s=0.0, ceiling_s=300, min_steps=4)
    assert 10 * max(p.step_times) == got and got >= 0.1
    assert p.learned_timeout(factor=10, floor_s=60.0, ceiling_s=300, min_steps=4) == 60.0
    assert p.learned_timeout(factor=1e6, floor_s=1.0, ceiling_s=300, min_steps=4) == 300
    hb = Heartbeat.from_progress(p, rank=3, timeout_s=9.0)
    assert Heartbeat.from_json(hb.to_json()) == hb


def test_filekv_set_once_has_exactly_one_winner(tmp_path: Path) -> None:
    kv = FileKV(tmp_path)
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(kv.set_once("hang", f"r{i}")))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and kv.get("hang") == results[0]
    kv.set("hb/0", "x")
    assert kv.multi_get(["hb/0", "hb/1"]) == ["x", None]


def test_pid_alive_sees_zombies_as_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert pid_alive(child.pid)
    child.kill()
    time.sleep(0.3)  # killed but not reaped: a zombie
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)


# -- two-phase timeouts on a real gloo group --------------------------------------------------------


@pytest.mark.slow
def test_two_phase_timeouts_on_gloo(tmp_path: Path) -> None:
    procs = wd_worker.start_timeouts(tmp_path)
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    out = json.loads((tmp_path / "timeouts.json").read_text())
    assert out["phase1_ok"]  # a 3 s straggler under the long init timeout: fine
    assert out["phase2"] == "raised" and out["hint"] == "gloo_timeout", out
    assert 1.0 < out["phase2_seconds"] < 5.0, out  # the short 1.5 s timeout applies, not 30 s


def test_flight_recorder_names_the_rank_behind_when_phases_are_equal():
    """Both ranks at step 3, phase train_batch: rank 0 waits inside all_to_all #50, rank 1 never
    issued it (its last is #49): rank 1 is the stuck one. Mixed process groups decide nothing."""
    from rocmtrain.faults.hang_report import refine_with_flight_recorder

    decision = {"cause": "stall", "stuck_ranks": [0, 1], "summary": "same point"}
    pg = ["0", "default_pg"]
    dumps = {
        0: {
            "last": {
                "collective_seq_id": 50,
                "profiling_name": "gloo:all_to_all",
                "process_group": pg,
            }
        },
        1: {
            "last": {
                "collective_seq_id": 49,
                "profiling_name": "gloo:broadcast",
                "process_group": pg,
            }
        },
    }
    refined = refine_with_flight_recorder(decision, dumps)
    assert refined["stuck_ranks"] == [1] and "#50 (gloo:all_to_all)" in refined["summary"]
    dumps[1]["last"]["process_group"] = ["1", "other"]
    assert refine_with_flight_recorder(decision, dumps) == decision
    assert refine_with_flight_recorder({**decision, "cause": "peer_failed"}, dumps)[
        "stuck_ranks"
    ] == [0, 1]

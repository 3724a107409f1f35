"""Registry gates fed with real version strings: each gate says which component's version decides and
the finding names the knob, the release that matters and the running one."""

from __future__ import annotations

import pytest

from rocmtrain.comms import registry
from rocmtrain.comms.rccl import Platform, plan_rccl_env
from rocmtrain.comms.registry import Versions, check_environment, gate_problems, parse_token_list
from rocmtrain.config.rccl import RcclConfig

TORCH_27 = "2.7.1+rocm6.3"
TORCH_28 = "2.8.0+rocm6.4"


def _v(**kw: str) -> Versions:
    return Versions.parse(**kw)


def test_every_entry_has_a_source_and_a_parseable_gate() -> None:
    for entry in registry.ENV_VARS.values():
        assert entry.source.startswith("https://"), entry.name
        tagged = "/blob/develop/" in entry.source or "/blob/main/" in entry.source
        # files on GitHub name a release tag; only changelogs/READMEs may point at a branch
        if "github.com" in entry.source and tagged:
            assert entry.source.endswith((".md", "README.md")), entry.name
        for gate in entry.gates:
            assert gate.component in ("rccl", "rocm", "torch"), entry.name
            assert registry.Gate.parse(gate.text()) == registry.Gate(
                gate.component, gate.op, gate.version, "", gate.archs
            )
        assert entry.gate_text()


def test_versions_parse_real_strings() -> None:
    assert _v(torch=TORCH_27) == Versions((2, 7, 1), None, (6, 3), None)
    assert _v(torch=TORCH_28, rccl="2.22.3").rocm == (6, 4)
    assert _v(rocm="7.13.0").rocm == (7, 13, 0)
    assert _v(torch=TORCH_27, rocm="7.1.0").rocm == (7, 1, 0)  # an explicit ROCm wins


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"])
def test_flight_recorder_names_gated_at_torch_28(name: str) -> None:
    (problem,) = gate_problems(name, _v(torch=TORCH_27))
    assert "needs PyTorch >= 2.8" in problem and "2.7.1" in problem
    assert gate_problems(name, _v(torch=TORCH_28)) == []
    (f,) = check_environment({name: "1"}, versions=_v(torch=TORCH_27), rocm=True)
    assert f.severity == "warning" and "PyTorch >= 2.8" in f.message


def test_old_flight_recorder_names_are_read_by_both() -> None:
    for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        for torch in (TORCH_27, TORCH_28):
            assert gate_problems(name, _v(torch=torch)) == []


@pytest.mark.parametrize(
    "torch, expected",
    [
        (
            (2, 7, 1),
            {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"},
        ),
        ((2, 8, 0), {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"}),
    ],
)  # fmt: skip
def test_plan_sets_the_names_the_running_torch_reads(torch, expected, tmp_path) -> None:
    plat = Platform(rocm=True, version=(2, 21, 5), rocm_version=(6, 3), torch_version=torch)
    env = plan_rccl_env(RcclConfig(), run_dir=tmp_path, plat=plat)
    fr = {k for k in env if "TRACE" in k or "_FR_" in k or "DUMP" in k or "DEBUG_INFO" in k}
    assert fr == expected
    assert env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE")) == "2000"


@pytest.mark.parametrize("rccl, ok", [("2.21.5", False), ("2.26.6", True), ("2.28.3", True)])
def test_override_knobs_gated_at_rccl_2_26_6(rccl: str, ok: bool) -> None:
    for name in ("RCCL_OVERRIDE_PROTO", "RCCL_OVERRIDE_ALGO"):
        problems = gate_problems(name, _v(rccl=rccl))
        assert (problems == []) is ok
        if not ok:
            assert "needs RCCL >= 2.26.6" in problems[0] and rccl in problems[0]


@pytest.mark.parametrize("rocm, ok", [("7.1.0", True), ("7.12.0", True), ("7.13.0", False)])
def test_msccl_removal_gated_on_rocm_not_rccl(rocm: str, ok: bool) -> None:
    # ROCm 7.11-7.13 all ship RCCL 2.28.3: the RCCL version cannot tell them apart
    have = _v(rccl="2.28.3", rocm=rocm)
    problems = gate_problems("RCCL_MSCCL_ENABLE", have)
    assert (problems == []) is ok
    if not ok:
        assert problems == [
            "RCCL_MSCCL_ENABLE was removed in ROCm 7.13; this ROCm is 7.13.0, which ignores it"
        ]
    assert gate_problems("RCCL_MSCCL_ENABLE", _v(rccl="2.28.3")) == []  # ROCm unknown: no claim


@pytest.mark.parametrize("rocm, ok", [("6.3", True), ("7.1.0", False), ("7.12.0", False)])
def test_mscclpp_off_from_rocm_7_1(rocm: str, ok: bool) -> None:
    problems = gate_problems("RCCL_MSCCLPP_ENABLE", _v(rocm=rocm))
    assert (problems == []) is ok
    if not ok:
        assert "has no effect from ROCm 7.1" in problems[0] and "off at build time" in problems[0]
    note = registry.lookup("RCCL_MSCCLPP_ENABLE").note
    assert "removed with MSCCL in RCCL 2.28.3" in note and "2.27.7" in note


def test_ll128_force_enable_does_nothing_on_gfx942_before_rocm_6_4_2() -> None:
    on_942 = _v(torch=TORCH_27, rccl="2.21.5", arch="gfx942")
    (problem,) = gate_problems("RCCL_LL128_FORCE_ENABLE", on_942)
    assert "ROCm >= 6.4.2 on gfx942" in problem
    assert gate_problems("RCCL_LL128_FORCE_ENABLE", _v(rocm="7.1.0", arch="gfx942")) == []
    assert gate_problems("RCCL_LL128_FORCE_ENABLE", _v(torch=TORCH_27, arch="gfx90a")) == []
    note = registry.lookup("RCCL_LL128_FORCE_ENABLE").note
    assert "16 GCDs + 8 NICs" in note and "on by default only on gfx90a" not in note


def test_ll128_force_enable_skipped_by_plan_on_gfx942_rocm_6_3() -> None:
    plat = Platform(rocm=True, version=(2, 21, 5), rocm_version=(6, 3), arch="gfx942")
    warns: list[str] = []
    env = plan_rccl_env(
        RcclConfig(ll128_force_enable=True), plat=plat, collective_only=True, warnings=warns
    )
    assert env == {} and any("RCCL_LL128_FORCE_ENABLE needs ROCm >= 6.4.2" in w for w in warns)


@pytest.mark.parametrize("rocm", ["7.1.0", "7.12.0", "7.13.0"])
def test_dead_thresholds_are_read_by_no_current_rccl(rocm: str) -> None:
    for name in ("NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD"):
        entry = registry.lookup(name)
        assert "no current RCCL" in entry.note and "never" not in entry.note
        assert "was removed in ROCm 3.2" in gate_problems(name, _v(rocm=rocm))[0]


def test_per_collective_syntax_validates_and_is_gated_at_2_24_3() -> None:
    value = "allreduce:tree;broadcast:ring"
    assert parse_token_list(value, field="NCCL_ALGO", allowed=registry.ALGO_TOKENS) == [
        "allreduce:Tree",
        "broadcast:Ring",
    ]
    assert parse_token_list(
        "AllReduce:^ll;simple", field="NCCL_PROTO", allowed=registry.PROTO_TOKENS
    ) == ["allreduce:^LL", "Simple"]
    for rccl in ("2.26.6", "2.28.3"):
        assert check_environment({"NCCL_ALGO": value}, versions=_v(rccl=rccl), rocm=True) == []
    (f,) = check_environment({"NCCL_ALGO": value}, versions=_v(rccl="2.21.5"), rocm=True)
    assert f.severity == "warning" and "needs RCCL >= 2.24.3" in f.message
    with pytest.raises(ValueError, match=r"unknown collective 'allgatherv'.*allreduce"):
        parse_token_list("allgatherv:ring", field="NCCL_ALGO", allowed=registry.ALGO_TOKENS)
    with pytest.raises(ValueError, match=r"NCCL_ALGO='allreduce:star'.*unknown token 'star'"):
        parse_token_list("allreduce:star", field="NCCL_ALGO", allowed=registry.ALGO_TOKENS)
    with pytest.raises(ValueError, match="unknown token"):  # the override knobs take one token
        parse_token_list("allreduce:tree", field="o", allowed=registry.ALGO_TOKENS,
                         allow_exclude=False)  # fmt: skip


def test_per_collective_config_value_is_set_canonically() -> None:
    plat = Platform(rocm=True, version=(2, 26, 6), rocm_version=(7, 0))
    cfg = RcclConfig(algorithm="allreduce:TREE;broadcast:ring")
    env = plan_rccl_env(cfg, plat=plat, collective_only=True)
    assert env == {"NCCL_ALGO": "allreduce:Tree;broadcast:Ring"}
    warns: list[str] = []
    old = Platform(rocm=True, version=(2, 21, 5), rocm_version=(6, 3))
    plan_rccl_env(cfg, plat=old, collective_only=True, warnings=warns)
    assert any("needs RCCL >= 2.24.3" in w for w in warns)


def test_nccl_debug_none_is_accepted() -> None:
    plat = Platform(rocm=True, version=(2, 28, 3), rocm_version=(7, 12, 0))
    assert plan_rccl_env(RcclConfig(debug="none"), plat=plat, collective_only=True) == {
        "NCCL_DEBUG": "NONE"
    }
    assert check_environment({"NCCL_DEBUG": "NONE"}, versions=_v(rccl="2.28.3"), rocm=True) == []


def test_nccl_proto_note_says_mi250_rule_not_mi300_heuristic() -> None:
    for name in ("NCCL_PROTO", "NCCL_ALGO"):
        note = registry.lookup(name).note
        assert "MI300 heuristic" not in note and "narrows the tuner" in note
    assert "pivotA2ANumBiRings == 3" in registry.lookup("NCCL_PROTO").note
    assert "rocm-6.3.0" in registry.lookup("NCCL_PROTO").source


def test_min_channels_note_has_no_32_with_fewer_than_8() -> None:
    note = registry.lookup("NCCL_MIN_NCHANNELS").note
    assert "32 with < 8" not in note and "2 and 4 ranks" in note and "112" in note


def test_hip_launch_blocking_is_serialize_kernel_2() -> None:
    entry = registry.lookup("HIP_LAUNCH_BLOCKING")
    assert "AMD_SERIALIZE_KERNEL=2" in entry.note and entry.replacement == "AMD_SERIALIZE_KERNEL=2"
    assert "clr/blob/rocm-" in entry.source


@pytest.mark.parametrize(
    "rocm, arch, default_on",
    [("7.1.0", "gfx942", True), ("6.3", "gfx942", True), ("6.0", "gfx942", False),
     ("7.1.0", "gfx90a", False), ("7.13.0", None, False)],
)  # fmt: skip
def test_hip_force_dev_kernarg_default_on_mi300_from_rocm_6_1(rocm, arch, default_on) -> None:
    have = _v(rocm=rocm, arch=arch)
    assert registry.is_default_on("HIP_FORCE_DEV_KERNARG", have) is default_on
    findings = check_environment({"HIP_FORCE_DEV_KERNARG": "1"}, versions=have, rocm=True)
    assert bool(findings) is default_on
    if default_on:
        assert findings[0].severity == "info" and "already the default" in findings[0].message
    note = registry.lookup("HIP_FORCE_DEV_KERNARG").note
    assert "gfx940/941/942" in note and "6.1" in note and "not default on gfx90a" in note


def test_cumem_thor2_claim_is_unverified() -> None:
    entry = registry.lookup("NCCL_CUMEM_ENABLE")
    assert not entry.verified and "unverified" in entry.note
    assert registry.valid_for_arch("NCCL_CUMEM_ENABLE", "gfx942") is not None


@pytest.mark.parametrize(
    ("torch", "rocm", "problem"),
    [
        ("2.11.0+rocm7.2", None, "PyTorch >= 2.12"),
        ("2.12.0+rocm7.2", None, None),
        ("2.12.0", "6.4", "ROCm >= 7.0"),
        ("2.13.0+rocm7.2", None, None),
    ],
)
def test_expandable_segments_is_gated_on_torch_2_12_and_rocm_7(torch, rocm, problem) -> None:
    """PyTorch honours expandable_segments on ROCm from 2.12 with ROCm >= 7.0 (PRs #177974,
    #179781); before, the setting is accepted and does nothing."""
    env = {"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:True"}
    found = check_environment(env, versions=_v(torch=torch, rocm=rocm), rocm=True)
    msgs = [f.message for f in found if f.name == "PYTORCH_HIP_ALLOC_CONF"]
    if problem is None:
        assert msgs == []
    else:
        assert len(msgs) == 1 and problem in msgs[0] and "ignores it" in msgs[0]
        assert "177974" in found[0].source
    # not asked for, or on NVIDIA: nothing to say
    off = {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:False"}
    assert check_environment(off, versions=_v(torch="2.11.0+rocm7.2"), rocm=True) == []
    assert check_environment(env, versions=_v(torch="2.11.0"), rocm=False) == []


def test_xnack_and_gid_notes_name_the_default_and_its_source() -> None:
    """HSA_XNACK unset leaves the driver's mode (amdgpu noretry=-1 auto); NCCL_IB_GID_INDEX
    defaults to -1 (auto) from RCCL 2.21.5 and 0 before: neither note claims a fixed default."""
    xnack = registry.lookup("HSA_XNACK")
    assert "off by default" not in xnack.note and "driver's mode" in xnack.note
    assert "amdgpu_drv.c" in xnack.source
    gid = registry.lookup("NCCL_IB_GID_INDEX")
    assert "2.21.5" in gid.note and "net_ib.cc" in gid.source

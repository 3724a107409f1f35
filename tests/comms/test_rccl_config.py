"""RcclConfig → env: validation before launch, version gates, user-wins/force, rccl.conf, presets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rocmtrain.comms.rccl import Platform, apply_rccl_config, plan_rccl_env
from rocmtrain.config import ConfigError
from rocmtrain.config.rccl import RcclConfig

REPO = Path(__file__).resolve().parents[2]
ROCM_OLD = Platform(rocm=True, version=(2, 21, 5))  # ROCm 6.3
ROCM_NEW = Platform(rocm=True, version=(2, 28, 3), rocm_version=(7, 13, 0))
CPU = Platform(rocm=None, version=None)
CUDA = Platform(rocm=False, version=(2, 27, 7))


def test_unset_default_sets_only_process_group_safety() -> None:
    env = plan_rccl_env(RcclConfig(), plat=ROCM_OLD)
    assert not any(k.startswith(("NCCL_", "RCCL_")) for k in env)
    assert env == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_FR_BUFFER_SIZE": "2000",
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}  # fmt: skip


def test_fields_map_to_real_names_canonically() -> None:
    cfg = RcclConfig(protocol="ll,simple", algorithm="^tree", min_channels=32, max_channels=64,
                     p2p_ll_threshold_bytes=16384, ll128_force_enable=True, debug="warn",
                     ib_gid_index=3, socket_ifname="^lo", flight_recorder_entries=0)  # fmt: skip
    env = plan_rccl_env(cfg, plat=ROCM_OLD, collective_only=True)
    assert env == {"NCCL_PROTO": "LL,Simple", "NCCL_ALGO": "^Tree", "NCCL_MIN_NCHANNELS": "32",
                   "NCCL_MAX_NCHANNELS": "64", "NCCL_P2P_LL_THRESHOLD": "16384",
                   "RCCL_LL128_FORCE_ENABLE": "1", "NCCL_DEBUG": "WARN", "NCCL_IB_GID_INDEX": "3",
                   "NCCL_SOCKET_IFNAME": "^lo"}  # fmt: skip


def test_invalid_values_fail_at_construction_with_field_value_and_allowed_set() -> None:
    with pytest.raises(ConfigError) as exc:
        RcclConfig(protocol="LL,Fast", algorithm="Ring,Star", min_channels=64, max_channels=8,
                   override_protocol="LL,Simple", debug="LOUD",
                   extra_env={"NCCL_PROTO": "LL"})  # fmt: skip
    assert exc.value.field == "rccl.protocol"
    msg = str(exc.value)
    for part in ["rccl.protocol='LL,Fast': unknown token 'Fast'", "LL, LL128, Simple",
                 "rccl.algorithm='Ring,Star'", "rccl.min_channels=64 > rccl.max_channels=8",
                 "rccl.override_protocol='LL,Simple': give exactly one",
                 "rccl.debug='LOUD': allowed values are NONE, VERSION, WARN, INFO, ABORT, TRACE",
                 "rccl.extra_env.NCCL_PROTO='LL': use the typed field rccl.protocol"]:  # fmt: skip
        assert part in msg, part


def test_wrong_types_and_unknown_keys_from_a_plain_mapping() -> None:
    with pytest.raises(ConfigError, match=r"min_channels.*many"):
        plan_rccl_env({"min_channels": "many"}, plat=CPU)
    with pytest.raises(ConfigError, match=r"min_channels='many': expected int"):
        RcclConfig(min_channels="many")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"protocl"):
        plan_rccl_env({"protocl": "LL"}, plat=CPU)


def test_version_gates() -> None:
    cfg = RcclConfig(override_protocol="LL", override_algorithm="tree", msccl_enable=False)
    warns: list[str] = []
    old = plan_rccl_env(cfg, plat=ROCM_OLD, collective_only=True, warnings=warns)
    assert old == {"RCCL_MSCCL_ENABLE": "0"}
    assert sum("needs RCCL >= 2.26.6" in w for w in warns) == 2
    assert any("RCCL_MSCCL_ENABLE: ROCm version unknown" in w for w in warns)
    warns.clear()
    new = plan_rccl_env(cfg, plat=ROCM_NEW, collective_only=True, warnings=warns)
    assert new == {"RCCL_OVERRIDE_PROTO": "LL", "RCCL_OVERRIDE_ALGO": "Tree"}
    assert any("RCCL_MSCCL_ENABLE was removed in ROCm 7.13" in w for w in warns)
    warns.clear()
    cpu = plan_rccl_env(cfg, plat=CPU, collective_only=True, warnings=warns)
    assert set(cpu) == {"RCCL_OVERRIDE_PROTO", "RCCL_OVERRIDE_ALGO", "RCCL_MSCCL_ENABLE"}
    assert sum("RCCL version unknown" in w for w in warns) == 3
    warns.clear()
    assert plan_rccl_env(cfg, plat=CUDA, collective_only=True, warnings=warns) == {}
    assert all("NVIDIA NCCL build" in w for w in warns) and len(warns) == 3


def test_heuristic_warning_when_protocol_is_set() -> None:
    warns: list[str] = []
    plan_rccl_env(RcclConfig(protocol="Simple"), plat=ROCM_OLD, warnings=warns)
    assert any("narrow RCCL's tuner" in w for w in warns)
    assert not any("MI300" in w and "heuristic" in w for w in warns)


def test_apply_user_wins_then_force(tmp_path: Path, caplog) -> None:
    env = {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"}
    cfg = RcclConfig(protocol="Simple", debug="WARN", min_channels=32)
    with caplog.at_level(logging.INFO):
        changed = apply_rccl_config(cfg, environ=env, plat=ROCM_OLD, conf_files=())
    assert env["NCCL_PROTO"] == "LL" and env["NCCL_DEBUG"] == "INFO"
    assert changed["NCCL_MIN_NCHANNELS"] == (None, "32")
    assert "NCCL_MIN_NCHANNELS: <unset> -> '32' (rccl config)" in caplog.text
    assert "NCCL_PROTO: 'LL' kept" in caplog.text
    cfg.force = True
    changed = apply_rccl_config(cfg, environ=env, plat=ROCM_OLD, conf_files=())
    assert changed == {"NCCL_PROTO": ("LL", "Simple"), "NCCL_DEBUG": ("INFO", "WARN")}


def test_apply_reports_invented_names_and_rejects_bad_proto_in_environment(caplog) -> None:
    env = {"RCCL_LL_THRESHOLD": "16384"}
    with caplog.at_level(logging.WARNING):
        apply_rccl_config(RcclConfig(), environ=env, plat=ROCM_OLD, conf_files=())
    assert "RCCL_LL_THRESHOLD does not exist" in caplog.text and env["RCCL_LL_THRESHOLD"] == "16384"
    with pytest.raises(ValueError, match="environment: NCCL_PROTO='LL65'"):
        apply_rccl_config(
            RcclConfig(), environ={"NCCL_PROTO": "LL65"}, plat=ROCM_OLD, conf_files=()
        )


def test_rccl_conf_files_are_reported(tmp_path: Path, caplog) -> None:
    conf = tmp_path / "rccl.conf"
    conf.write_text("# site defaults\nNCCL_DEBUG=WARN\nRCCL_PROTO=LL\n")
    with caplog.at_level(logging.WARNING):
        apply_rccl_config(RcclConfig(), environ={}, plat=ROCM_OLD,
                          conf_files=(conf, tmp_path / "absent.conf"))  # fmt: skip
    assert f"RCCL also reads {conf}" in caplog.text and "NCCL_DEBUG=WARN" in caplog.text
    assert "RCCL_PROTO does not exist" in caplog.text and f"found in {conf}" in caplog.text
    assert "absent.conf" not in caplog.text


def test_flight_recorder_dump_prefix_under_run_dir(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    apply_rccl_config(RcclConfig(), run_dir=tmp_path / "run", environ=env, plat=CPU, conf_files=())
    prefix = Path(env["TORCH_FR_DUMP_TEMP_FILE"])
    assert prefix == tmp_path / "run" / "flight_recorder" / "rank_" and prefix.parent.is_dir()
    explicit = plan_rccl_env(
        RcclConfig(flight_recorder_dump_prefix="/x/fr_"), run_dir=tmp_path, plat=CPU
    )
    assert explicit["TORCH_FR_DUMP_TEMP_FILE"] == "/x/fr_"


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in (REPO / "configs" / "rccl").glob("*.yaml"))
)
def test_presets_compose_and_validate(preset: str) -> None:
    node = OmegaConf.load(REPO / "configs" / "rccl" / preset)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RcclConfig), node))
    env = plan_rccl_env(cfg, plat=ROCM_OLD)
    assert (
        "NCCL_PROTO" not in env and "NCCL_ALGO" not in env
    )  # hand-written presets keep the heuristic
    if preset == "default.yaml":
        assert len(node) == 0


def test_dictconfig_input() -> None:
    node = OmegaConf.merge(OmegaConf.structured(RcclConfig), {"protocol": "LL128"})
    assert plan_rccl_env(node, plat=ROCM_OLD, collective_only=True) == {"NCCL_PROTO": "LL128"}


def test_invented_name_in_config_warns_with_replacement_and_is_never_set(caplog) -> None:
    cfg = RcclConfig(extra_env={"RCCL_LL_THRESHOLD": "0", "TORCH_HIP_MEM_POOL_ENABLE": "1",
                                "HSA_NO_SCRATCH_RECLAIM": "1"})  # fmt: skip
    env: dict[str, str] = {}
    with caplog.at_level(logging.WARNING):
        changed = apply_rccl_config(cfg, environ=env, plat=ROCM_OLD, conf_files=())
    assert "RCCL_LL_THRESHOLD" not in env and "TORCH_HIP_MEM_POOL_ENABLE" not in env
    assert changed["HSA_NO_SCRATCH_RECLAIM"] == (None, "1")
    assert "rccl.extra_env.RCCL_LL_THRESHOLD: RCCL_LL_THRESHOLD does not exist" in caplog.text
    assert "use NCCL_PROTO / RCCL_OVERRIDE_PROTO instead" in caplog.text
    assert "use PYTORCH_HIP_ALLOC_CONF instead" in caplog.text

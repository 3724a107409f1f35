"""Every preset in configs/rccl/ sets only knobs whose registry entry is sourced and valid for the arch
the preset is written for (no unverified claim, no knob without effect there, no failing arch gate)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rocmtrain.comms import registry
from rocmtrain.comms.rccl import Platform, plan_rccl_env
from rocmtrain.config.rccl import RcclConfig

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs" / "rccl").glob("*.yaml"))
#: the arch each preset is written for (None: any arch); a new preset must be added here
PRESET_ARCH: dict[str, str | None] = {
    "default.yaml": None,
    "h200_2gpu_measured.yaml": "sm_90",
    "mi250_8gcd.yaml": "gfx90a",
    "mi300x_8gpu.yaml": "gfx942",
    "multinode_roce.yaml": None,
}
#: the versions a preset is checked at: the oldest and newest stacks rocmtrain documents
STACKS = (
    registry.Versions.parse(torch="2.7.1+rocm6.3", rccl="2.21.5"),
    registry.Versions.parse(torch="2.8.0+rocm6.4", rccl="2.22.3"),
    registry.Versions.parse(rccl="2.28.3", rocm="7.13.0"),
)


def _planned(path: Path) -> dict[str, str]:
    node = OmegaConf.load(path)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RcclConfig), node))
    return plan_rccl_env(cfg, plat=Platform(rocm=None, version=None))


def test_every_preset_has_an_arch() -> None:
    assert {p.name for p in PRESETS} == set(PRESET_ARCH)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_sets_only_sourced_knobs_valid_for_its_arch(path: Path) -> None:
    arch = PRESET_ARCH[path.name]
    for name in _planned(path):
        entry = registry.lookup(name)
        assert entry is not None, f"{path.name}: {name} is not in the registry"
        assert entry.source.startswith("https://"), f"{path.name}: {name} has no source"
        for have in STACKS:
            problem = registry.valid_for_arch(name, arch, have)
            assert problem is None, f"{path.name}: {problem}"


def test_unverified_entries_exist_and_are_refused() -> None:
    unverified = [e.name for e in registry.ENV_VARS.values() if not e.verified]
    assert "NCCL_CUMEM_ENABLE" in unverified
    for name in unverified:
        assert "unverified" in registry.valid_for_arch(name, None)


def test_arch_scope_is_enforced() -> None:
    assert "only on nvidia" in registry.valid_for_arch("NCCL_NVLS_ENABLE", "gfx942")
    assert registry.valid_for_arch("NCCL_NVLS_ENABLE", "sm_90") is None
    old = registry.Versions.parse(torch="2.7.1+rocm6.3")
    assert "rocm>=6.4.2" in registry.valid_for_arch("RCCL_LL128_FORCE_ENABLE", "gfx942", old)
    assert registry.valid_for_arch("RCCL_LL128_FORCE_ENABLE", "gfx90a", old) is None
    assert "fabricated" in registry.valid_for_arch("RCCL_PROTO", None)


def test_mi250_preset_no_longer_claims_ll128_default() -> None:
    text = (REPO / "configs" / "rccl" / "mi250_8gcd.yaml").read_text()
    assert "already on by default" not in text and "16 GCDs + 8 NICs" in text


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_comments_do_not_claim_an_mi300_heuristic(path: Path) -> None:
    text = path.read_text()
    assert "MI300 heuristic" not in text and "on MI300 it picks" not in text
    assert "32 with fewer than 8" not in text


def test_roce_preset_leaves_the_gid_index_to_rccl() -> None:
    """RCCL >= 2.21.5 picks the RoCE v2 GID itself (NCCL_IB_GID_INDEX default -1): the preset must
    not force a site's index on everyone."""
    planned = _planned(REPO / "configs" / "rccl" / "multinode_roce.yaml")
    assert planned["NCCL_SOCKET_IFNAME"] == "^lo,docker"  # the preset itself was planned
    assert "NCCL_IB_GID_INDEX" not in planned

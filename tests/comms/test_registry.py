"""The env-var registry: invented names, their real replacements, value checks and version gates."""

from __future__ import annotations

import pytest

from rocmtrain.comms import registry
from rocmtrain.comms.registry import check_environment, lookup, parse_token_list, version_problem

# name -> the real replacement (the brief's list of invented/dead knobs)
INVENTED = {
    "RCCL_PROTO": "NCCL_PROTO",
    "RCCL_LL_THRESHOLD": "NCCL_PROTO",
    "NCCL_LL_THRESHOLD": "NCCL_PROTO",
    "NCCL_TREE_THRESHOLD": "NCCL_ALGO",
    "NCCL_LL128_THRESHOLD": "NCCL_PROTO",
    "TORCH_HIP_MEM_POOL_ENABLE": "PYTORCH_HIP_ALLOC_CONF",
    "HIP_MATRIX_ACCUMULATE_PRECISION": "set_float32_matmul_precision",
    "RCCL_ENABLE_MSCCLPP": "RCCL_MSCCLPP_ENABLE",
}


@pytest.mark.parametrize("name, real", sorted(INVENTED.items()))
def test_invented_name_in_environment_warns_with_replacement(name: str, real: str) -> None:
    findings = check_environment({name: "1", "PATH": "/usr/bin"})
    assert [f.name for f in findings] == [name]
    f = findings[0]
    assert f.severity == "warning" and real in f.message and real in (f.replacement or "")
    assert registry.is_forbidden(name)


def test_statuses_follow_the_facts() -> None:
    assert lookup("NCCL_LL_THRESHOLD").status == "dead"
    assert lookup("RCCL_PROTO").status == "fabricated"
    assert lookup("HIP_ENABLE_DOUBLE_BUFFER").status == "fabricated"
    assert lookup("HIP_ENABLE_DOUBLE_BUFFER").replacement is None
    assert (
        lookup("HIP_TRACE_API").status == "legacy"
        and lookup("HIP_TRACE_API").replacement == "AMD_LOG_LEVEL"
    )
    assert lookup("NCCL_P2P_LL_THRESHOLD").status == "real"
    assert lookup("NOT_A_VAR") is None
    for entry in registry.ENV_VARS.values():
        assert entry.source.startswith("https://"), entry.name
        assert entry.status in ("real", "legacy", "fabricated", "dead")


def test_legacy_names_warn_but_are_not_forbidden() -> None:
    (f,) = check_environment({"HIP_COHERENT_HOST_ALLOC": "1"})
    assert "HIP_HOST_COHERENT" in f.message and not registry.is_forbidden("HIP_COHERENT_HOST_ALLOC")


def test_real_names_with_good_values_are_quiet() -> None:
    env = {"NCCL_PROTO": "ll,Simple", "NCCL_ALGO": "^Tree", "NCCL_DEBUG": "WARN", "HOME": "/root"}
    assert check_environment(env, rccl_version=(2, 21, 5), rocm=True) == []


@pytest.mark.parametrize("value", ["LL64", "Ring", "LL,,Simple", "", "^"])
def test_invalid_nccl_proto_is_an_error(value: str) -> None:
    (f,) = check_environment({"NCCL_PROTO": value})
    assert f.severity == "error" and "NCCL_PROTO" in f.message and "LL, LL128, Simple" in f.message


def test_token_parsing() -> None:
    assert parse_token_list("ll128,SIMPLE", field="p", allowed=registry.PROTO_TOKENS) == [
        "LL128",
        "Simple",
    ]
    assert parse_token_list("^ll", field="p", allowed=registry.PROTO_TOKENS) == ["^", "LL"]
    with pytest.raises(ValueError, match=r"rccl.protocol='Fast'.*unknown token 'Fast'"):
        parse_token_list("Fast", field="rccl.protocol", allowed=registry.PROTO_TOKENS)
    with pytest.raises(ValueError, match="unknown token"):
        parse_token_list("^LL", field="o", allowed=registry.PROTO_TOKENS, allow_exclude=False)


def test_version_gates() -> None:
    assert "needs RCCL >= 2.26.6" in version_problem("RCCL_OVERRIDE_PROTO", (2, 21, 5))
    assert version_problem("RCCL_OVERRIDE_PROTO", (2, 26, 6)) is None
    # gated on ROCm, not RCCL: ROCm 7.11-7.13 all ship RCCL 2.28.3
    assert version_problem("RCCL_MSCCL_ENABLE", (2, 28, 3)) is None
    assert version_problem("RCCL_OVERRIDE_ALGO", None) is None
    (f,) = check_environment({"RCCL_OVERRIDE_ALGO": "Tree"}, rccl_version=(2, 22, 3), rocm=True)
    assert f.severity == "warning" and "2.26.6" in f.message


def test_nvidia_build_and_near_misses() -> None:
    (f,) = check_environment({"RCCL_MSCCLPP_ENABLE": "1"}, rocm=False)
    assert f.severity == "info" and "NVIDIA NCCL ignores it" in f.message
    (f,) = check_environment({"NCCL_MIN_NCHANNEL": "32"})
    assert f.replacement == "NCCL_MIN_NCHANNELS"
    (f,) = check_environment({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})
    assert f.severity == "info" and "TORCH_FR_BUFFER_SIZE" in f.message
    assert {x.name for x in check_environment({"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})} == {
        "HSA_OVERRIDE_GFX_VERSION"
    }


def test_every_env_mapped_rccl_field_has_a_registry_row() -> None:
    from rocmtrain.comms.rccl import COLLECTIVE_FIELDS, PG_FIELDS
    from rocmtrain.config.rccl import env_fields

    mapped = env_fields()
    assert mapped == {**COLLECTIVE_FIELDS, **PG_FIELDS}  # the tables are derived, not kept
    missing = {name: env for name, env in mapped.items() if lookup(env) is None}
    assert not missing, f"add a row to comms/registry.py for {missing}"

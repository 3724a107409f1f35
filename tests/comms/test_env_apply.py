"""apply_env: the one writer of process env vars (user wins, force, unset, logging, invented names)."""

from __future__ import annotations

import logging
import os

import pytest

from rocmtrain.comms.env import apply_env


def test_sets_logs_and_returns_changes(caplog) -> None:
    env = {"NCCL_DEBUG": "INFO"}
    with caplog.at_level(logging.INFO, logger="rocmtrain.comms.env"):
        changed = apply_env(
            {"NCCL_PROTO": "Simple", "NCCL_DEBUG": "WARN"}, source="test", environ=env
        )
    assert changed == {"NCCL_PROTO": (None, "Simple")}
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_PROTO": "Simple"}  # the user's value won
    assert "NCCL_PROTO: <unset> -> 'Simple' (test)" in caplog.text
    assert "NCCL_DEBUG: 'INFO' kept" in caplog.text


def test_force_overrides_and_none_unsets(caplog) -> None:
    env = {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree"}
    with caplog.at_level(logging.INFO, logger="rocmtrain.comms.env"):
        changed = apply_env({"NCCL_DEBUG": "WARN", "NCCL_ALGO": None}, force=True, environ=env)
    assert changed == {"NCCL_DEBUG": ("INFO", "WARN"), "NCCL_ALGO": ("Tree", None)}
    assert env == {"NCCL_DEBUG": "WARN"}
    assert "NCCL_ALGO: 'Tree' -> <unset>" in caplog.text
    assert apply_env({"NCCL_DEBUG": "WARN"}, environ=env) == {}  # no-op is not a change


@pytest.mark.parametrize("name", ["RCCL_PROTO", "NCCL_LL_THRESHOLD", "HIP_ENABLE_DOUBLE_BUFFER"])
def test_invented_names_are_never_set(name: str) -> None:
    env: dict[str, str] = {}
    with pytest.raises(ValueError, match=f"{name}.*nothing reads them"):
        apply_env({name: "1", "NCCL_DEBUG": "WARN"}, environ=env, force=True)
    assert env == {}  # validated before anything was written


def test_legacy_name_is_set_with_a_warning(caplog) -> None:
    env: dict[str, str] = {}
    with caplog.at_level(logging.WARNING, logger="rocmtrain.comms.env"):
        apply_env({"HIP_TRACE_API": "1"}, environ=env)
    assert env == {"HIP_TRACE_API": "1"} and "AMD_LOG_LEVEL" in caplog.text


def test_writes_the_real_process_environment(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_BUFFSIZE", "placeholder")  # recorded, so teardown removes it
    monkeypatch.delenv("NCCL_BUFFSIZE")
    monkeypatch.setenv("NCCL_CROSS_NIC", "1")
    changed = apply_env({"NCCL_BUFFSIZE": "8388608", "NCCL_CROSS_NIC": "0"})
    assert os.environ["NCCL_BUFFSIZE"] == "8388608" and os.environ["NCCL_CROSS_NIC"] == "1"
    assert changed == {"NCCL_BUFFSIZE": (None, "8388608")}

"""Turn an :class:`~rocmtrain.config.rccl.RcclConfig` into environment variables, validated and logged.

RCCL (and NCCL) read each knob once, when the first communicator is created, so this runs in every rank
*before* ``init_process_group`` (the strategy's ``setup_environment`` calls it; ranks started by Slurm
run the same code):

    from rocmtrain.comms.rccl import apply_rccl_config, plan_rccl_env
    plan_rccl_env(cfg.rccl)                      # pure: {"NCCL_PROTO": "LL,Simple", ...} for dry runs
    apply_rccl_config(cfg.rccl, run_dir=run_dir)  # sets them; logs "NAME: old -> new"

Rules: a field left ``None`` sets nothing (RCCL keeps its own tuning; ``NCCL_PROTO``/``NCCL_ALGO`` narrow
the tuner's choices, so they belong in a preset only when a sweep measured a gain); a value the user
already exported wins unless ``cfg.force``; an invalid value (``protocol="LL64"``) raises ``ConfigError``
naming the field, the value and the allowed set when the config is constructed; version-gated knobs are
skipped with a warning when the running RCCL, ROCm or PyTorch does not read them (the gates live in
:mod:`rocmtrain.comms.registry`); ``~/.rccl.conf`` and ``/etc/rccl.conf`` are reported because RCCL
reads them too. The flight-recorder variables use the names the running PyTorch reads: ``TORCH_FR_*``
from 2.8, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmtrain import platform
from rocmtrain.comms import registry
from rocmtrain.comms.env import apply_env
from rocmtrain.config.convert import as_config
from rocmtrain.config.rccl import RcclConfig, env_fields

log = logging.getLogger(__name__)

#: RcclConfig field → env var, derived from the fields' ``knob(...)`` declarations: the
#: NCCL/RCCL/HIP side (what rccl-tests also understands) and the PyTorch ProcessGroupNCCL side
COLLECTIVE_FIELDS: dict[str, str] = env_fields("collective")
PG_FIELDS: dict[str, str] = env_fields("pg")
#: flight-recorder names of PyTorch >= 2.8 (pytorch PR #152563) → the names PyTorch <= 2.7 reads
_OLD_FR_NAMES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}
#: the first PyTorch that reads the TORCH_FR_* names (older ones read only the _OLD_FR_NAMES values)
FR_NAMES_SINCE = (2, 8)
RCCL_CONF_FILES = (Path("~/.rccl.conf"), Path("/etc/rccl.conf"))


@dataclass(frozen=True)
class Platform:
    """What the gates need to know: RCCL (ROCm) or NCCL (CUDA) or neither, and the versions.

    ``version`` is the RCCL/NCCL version; ``rocm_version`` the ROCm release (some RCCL knobs are gated
    on it because several ROCm releases ship the same RCCL); ``torch_version`` decides the
    flight-recorder names (None: the installed torch); ``arch`` the GPU arch (``gfx942``).
    """

    rocm: bool | None
    """True: RCCL reads the knobs; False: NVIDIA NCCL; None: unknown (CPU build)."""
    version: tuple[int, ...] | None
    rocm_version: tuple[int, ...] | None = None
    torch_version: tuple[int, ...] | None = None
    arch: str | None = None

    @classmethod
    def detect(cls) -> Platform:
        """The running process: RCCL/NCCL version, HIP (ROCm) version, torch version, GPU 0's arch."""
        torch_v = platform.torch_version()
        if platform.is_rocm():
            return cls(True, platform.nccl_version(), _rocm_release(), torch_v, _arch())
        if platform.is_cuda_build():
            return cls(False, platform.nccl_version(), None, torch_v)
        return cls(None, None, None, torch_v)

    def versions(self) -> registry.Versions:
        """The registry's view of this platform (RCCL version only on ROCm)."""
        torch_v = self.torch_version or platform.torch_version()
        rccl = self.version if self.rocm else None
        return registry.Versions(torch_v, rccl, self.rocm_version, self.arch)


def _rocm_release() -> tuple[int, ...] | None:
    """ROCm major.minor of this torch build (:func:`rocmtrain.platform.rocm_version`: from
    ``torch.version.rocm``, else ``torch.version.hip``, ``6.3.42131-fa1d09cfd`` → (6, 3)). HIP's
    third field is a build number, not the ROCm patch level, so only two fields are trusted."""
    rocm = platform.rocm_version()
    return tuple(rocm[:2]) if rocm else None


def _arch() -> str | None:
    """GPU 0's gfx arch, or None when no GPU is visible (CPU-only node preparing a launch)."""
    try:
        return platform.device_info(0).arch
    except Exception:  # no device: the arch-specific gates are then not checked
        return None


def as_rccl_config(cfg: Any) -> RcclConfig:
    """``cfg`` as a validated RcclConfig (kept for callers; :func:`rocmtrain.config.convert.as_config`
    is the one converter)."""
    return as_config(cfg, RcclConfig, field="rccl", group="rccl")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _canonical(name: str, value: Any) -> str:
    """Spell validated values the way the libraries document them (``ll,simple`` → ``LL,Simple``)."""
    if name in ("protocol", "override_protocol", "algorithm", "override_algorithm"):
        allowed = (
            registry.PROTO_TOKENS
            if "protocol" in name
            else (registry.ALGO_TOKENS + registry.ALGO_TOKENS_OTHER)
        )
        toks = registry.parse_token_list(value, field=name, allowed=allowed)
        if registry.is_per_collective(str(value)):
            return ";".join(toks)
        return ("^" if toks[0] == "^" else "") + ",".join(t for t in toks if t != "^")
    if name == "debug":
        return str(value).upper()
    return _fmt(value)


def _warnings(cfg: RcclConfig, plat: Platform) -> list[str]:
    """What depends on the platform or is legal but unwise (the errors were raised when ``cfg``
    was constructed: :meth:`RcclConfig.validate`)."""
    warnings: list[str] = []
    for name in ("algorithm", "override_algorithm"):
        value = getattr(cfg, name)
        if (
            value
            and plat.rocm
            and any(t.lower() in str(value).lower() for t in registry.ALGO_TOKENS_OTHER)
        ):
            warnings.append(f"rccl.{name}={value!r}: only Ring and Tree are usable on AMD")
    if cfg.dump_on_timeout and cfg.async_error_handling not in (None, 3):
        warnings.append(
            f"rccl.dump_on_timeout needs async_error_handling=3 for flight-recorder "
            f"dumps; it is {cfg.async_error_handling}"
        )
    for key in cfg.extra_env:
        entry = registry.lookup(key)
        if entry is not None and entry.status in ("fabricated", "dead"):
            warnings.append(f"rccl.extra_env.{key}: {registry.describe(entry)}; not set")
        elif entry is not None and entry.status == "legacy":
            warnings.append(f"rccl.extra_env.{key}: {registry.describe(entry)}")
    return warnings


def validate_rccl_config(cfg: RcclConfig, *, plat: Platform | None = None) -> list[str]:
    """The platform's warnings about ``cfg`` (its errors were raised when it was built)."""
    return _warnings(cfg, plat or Platform.detect())


def _unknown_gate_versions(name: str, have: registry.Versions) -> list[str]:
    """Names of the components whose version ``name``'s gates need but ``have`` lacks."""
    return sorted(
        registry.COMPONENT_NAMES[c] for c in registry.gate_components(name) if have.of(c) is None
    )


def _gate(env: dict[str, str], plat: Platform, warnings: list[str]) -> dict[str, str]:
    """Drop the knobs the running RCCL/ROCm/PyTorch does not read (each with a warning)."""
    out: dict[str, str] = {}
    have = plat.versions()
    for name, value in env.items():
        if name.startswith("RCCL_") and plat.rocm is False:
            warnings.append(f"{name} skipped: read only by RCCL; this is an NVIDIA NCCL build")
            continue
        collective = name.startswith(("NCCL_", "RCCL_"))
        if registry.is_gated(name) and (plat.rocm or not collective):
            problems = registry.gate_problems(name, have)
            if problems:
                warnings.append(f"{problems[0]}: not set")
                continue
            missing = _unknown_gate_versions(name, have)
            if missing:
                warnings.append(
                    f"{name}: {'/'.join(missing)} version unknown, cannot check its version gate; set"
                )
        elif registry.is_gated(name) and collective and plat.rocm is None:
            warnings.append(
                f"{name}: RCCL version unknown (no RCCL in this build, e.g. CPU); its "
                "version gate is not checked; set anyway"
            )
        out[name] = value
    return out


def _flight_recorder_names(pg: dict[str, Any], torch_version: tuple[int, ...]) -> dict[str, Any]:
    """Rename the TORCH_FR_* variables to the ones PyTorch <= 2.7 reads (it ignores TORCH_FR_*)."""
    if tuple(torch_version) >= FR_NAMES_SINCE:
        return pg
    return {_OLD_FR_NAMES.get(k, k): v for k, v in pg.items()}


def plan_rccl_env(
    cfg: Any,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    plat: Platform | None = None,
    collective_only: bool = False,
    warnings: list[str] | None = None,
) -> dict[str, str]:
    """What :func:`apply_rccl_config` would set (pure; raises ValueError on an invalid config).

    ``collective_only`` drops the PyTorch process-group variables (what rccl-tests sweeps use).
    ``warnings`` (a list) collects the validation and version-gate warnings.
    """
    cfg = as_rccl_config(cfg)
    plat = plat or Platform.detect()
    warns = validate_rccl_config(cfg, plat=plat)
    env: dict[str, str] = {}
    for name, var in COLLECTIVE_FIELDS.items():
        value = getattr(cfg, name)
        if value is not None:
            env[var] = _canonical(name, value)
    # invented/dead names are never set (validation warned, naming the real knob)
    env.update({k: _fmt(v) for k, v in cfg.extra_env.items() if not registry.is_forbidden(k)})
    if not collective_only:
        pg = {var: getattr(cfg, name) for name, var in PG_FIELDS.items()}
        pg["TORCH_FR_DUMP_TEMP_FILE"] = flight_recorder_prefix(cfg, run_dir)
        pg = _flight_recorder_names(pg, plat.torch_version or platform.torch_version())
        env.update({k: _fmt(v) for k, v in pg.items() if v is not None})
    if cfg.protocol is not None or cfg.algorithm is not None:
        warns.append(
            "NCCL_PROTO/NCCL_ALGO set: they narrow RCCL's tuner to the listed choices (leave them "
            "unset unless a sweep on this machine shows a gain)"
        )
    warns += _per_collective_warnings(cfg, plat)
    env = _gate(env, plat, warns)
    if warnings is not None:
        warnings.extend(warns)
    return env


def _per_collective_warnings(cfg: RcclConfig, plat: Platform) -> list[str]:
    """The per-collective NCCL_PROTO/NCCL_ALGO form on an RCCL too old to read it."""
    out = []
    for name in ("protocol", "algorithm"):
        value = getattr(cfg, name)
        if value is None or not registry.is_per_collective(str(value)) or not plat.rocm:
            continue
        if plat.version is not None:
            problem = registry.PER_COLLECTIVE_GATE.problem(f"rccl.{name}={value!r}", plat.version)
            if problem:
                out.append(problem)
    return out


def flight_recorder_prefix(cfg: Any, run_dir: str | os.PathLike[str] | None) -> str | None:
    """Where the flight-recorder dumps go (``TORCH_FR_DUMP_TEMP_FILE``); the rank is appended."""
    cfg = as_rccl_config(cfg)
    if cfg.flight_recorder_dump_prefix is not None:
        return cfg.flight_recorder_dump_prefix
    return None if run_dir is None else str(Path(run_dir) / "flight_recorder" / "rank_")


def read_rccl_conf(paths: tuple[Path, ...] = RCCL_CONF_FILES) -> dict[Path, dict[str, str]]:
    """``NAME=VALUE`` lines of the RCCL config files present (RCCL applies them too)."""
    found: dict[Path, dict[str, str]] = {}
    for path in paths:
        path = path.expanduser()
        if not path.is_file():
            continue
        values: dict[str, str] = {}
        for line in path.read_text(errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
        found[path] = values
    return found


def environment_findings(
    environ: Mapping[str, str],
    *,
    plat: Platform | None = None,
    conf_files: tuple[Path, ...] = RCCL_CONF_FILES,
) -> list[str]:
    """Warnings about the process environment and the RCCL config files (invented, dead or
    version-gated names, with the real knob); raises ValueError for an unusable value."""
    plat = plat or Platform.detect()
    warnings: list[str] = []
    for finding in registry.check_environment(
        dict(environ), versions=plat.versions(), rocm=plat.rocm
    ):
        if finding.severity == "error":
            raise ValueError(f"environment: {finding.message}")
        warnings.append(f"environment: {finding.message}")
    for path, values in read_rccl_conf(conf_files).items():
        shown = ", ".join(f"{k}={v}" for k, v in values.items()) or "(no settings)"
        warnings.append(f"RCCL also reads {path} (it applies these): {shown}")
        for key in values:
            finding = registry.check_name(key, where=str(path))
            if finding is not None:
                warnings.append(finding.message)
    return warnings


def apply_rccl_config(
    cfg: Any,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    environ: MutableMapping[str, str] | None = None,
    plat: Platform | None = None,
    conf_files: tuple[Path, ...] = RCCL_CONF_FILES,
) -> dict[str, tuple[str | None, str | None]]:
    """Validate ``cfg`` and set its env vars (call before the process group exists).

    Returns ``{NAME: (old, new)}`` for what changed. ``environ`` defaults to ``os.environ``.
    """
    cfg = as_rccl_config(cfg)
    env_now = os.environ if environ is None else environ
    plat = plat or Platform.detect()
    warnings: list[str] = []
    planned = plan_rccl_env(cfg, run_dir=run_dir, plat=plat, warnings=warnings)
    warnings += environment_findings(dict(env_now), plat=plat, conf_files=conf_files)
    for text in warnings:
        log.warning("rccl: %s", text)
    if plat.version is not None:
        lib = "RCCL" if plat.rocm else "NCCL"
        log.info("rccl: %s %s", lib, ".".join(map(str, plat.version)))
    changes = apply_env(planned, force=cfg.force, source="rccl config", environ=environ)
    prefix = planned.get("TORCH_FR_DUMP_TEMP_FILE") or planned.get(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    )
    if prefix and (
        "TORCH_FR_DUMP_TEMP_FILE" in changes or "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in changes
    ):
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    return changes


class CollectiveEnv:
    """The collective environment of one run: applied before the process group exists,
    restored when the run ends (every change and its undo go through :func:`apply_env`)."""

    def __init__(self, cfg: RcclConfig) -> None:
        self.cfg = cfg
        self.changes: dict[str, tuple[str | None, str | None]] = {}
        """``{NAME: (before, after)}`` of what :meth:`apply` changed and :meth:`restore` undoes."""

    def apply(self, run_dir: str | os.PathLike[str] | None) -> None:
        """Check the environment and set the config's variables (logged ``NAME: old -> new``)."""
        from rocmtrain.config import ConfigError

        try:
            self.changes = apply_rccl_config(self.cfg, run_dir=run_dir)
        except ConfigError:
            raise
        except ValueError as exc:  # an unusable value the user exported
            raise ConfigError("rccl", "(environment)", str(exc)) from exc

    def restore(self) -> None:
        """Put back what :meth:`apply` changed."""
        if self.changes:
            old = {name: before for name, (before, _) in self.changes.items()}
            apply_env(old, force=True, source="teardown")
            self.changes = {}

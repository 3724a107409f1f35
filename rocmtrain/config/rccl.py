"""RCCL/NCCL + process-group schema (Hydra group ``rccl``; presets in ``configs/rccl/``).

Every field left at ``None`` sets nothing: RCCL keeps its own choice. That is deliberate — ``NCCL_PROTO``
and ``NCCL_ALGO`` narrow RCCL's tuner to the listed choices (one protocol for all sizes loses at one
end), so the ``default`` preset leaves them unset. RCCL 2.21.5's one hard-coded AllReduce rule that they
bypass runs only on the 16-GCD MI250 topology model, not on MI300X. Only measured settings
(``python -m rocmtrain rccl-tests sweep``) belong in a preset. Applied by
:func:`rocmtrain.comms.rccl.apply_rccl_config` in every rank before the process group exists;
``python -m rocmtrain rccl=mi300x_8gpu rccl.force=true ...`` selects a preset from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from rocmtrain.config import ConfigError

#: the value domains a knob may declare (``knob(..., tokens=...)``) and the words they accept;
#: the token lists themselves live with the env-var registry, which also checks exported values
TOKEN_SETS = ("protocol", "algorithm")


def knob(
    env: str,
    *,
    default: Any = None,
    side: str = "collective",
    tokens: str | None = None,
    single: bool = False,
    choices: tuple[str, ...] | None = None,
    between: tuple[int, int] | None = None,
    positive: bool = False,
) -> Any:
    """A field that sets the environment variable ``env``, with its domain declared beside it.

    ``side`` is ``collective`` (read by RCCL/NCCL and rccl-tests) or ``pg`` (read by PyTorch's
    ProcessGroupNCCL). The tables of :mod:`rocmtrain.comms.rccl` and the validation below are
    derived from these declarations, so a new knob is this one field plus its registry row.
    """
    meta = {"env": env, "side": side, "tokens": tokens, "single": single, "choices": choices,
            "between": between, "positive": positive}  # fmt: skip
    return field(default=default, metadata=meta)


def env_fields(side: str | None = None) -> dict[str, str]:
    """``{field: env var}`` of the knobs of ``side`` (``None``: both), in declaration order."""
    return {
        f.name: f.metadata["env"]
        for f in fields(RcclConfig)
        if "env" in f.metadata and side in (None, f.metadata["side"])
    }


@dataclass
class RcclConfig:
    """Collective-library knobs applied before the process group exists, and PG timeouts."""

    # -- protocol / algorithm (unset = RCCL's own tuning model) --
    protocol: str | None = knob("NCCL_PROTO", tokens="protocol")
    """``NCCL_PROTO``: comma list of LL, LL128, Simple (case-insensitive), leading ``^`` = all except;
    per collective ``"allreduce:simple;broadcast:ll"`` with RCCL/NCCL >= 2.24.3. None leaves RCCL's
    tuner in charge (recommended unless a sweep says otherwise)."""
    algorithm: str | None = knob("NCCL_ALGO", tokens="algorithm")
    """``NCCL_ALGO``: Ring or Tree on AMD (comma list, ``^`` allowed; per collective
    ``"allreduce:tree;broadcast:ring"`` with RCCL/NCCL >= 2.24.3). None = RCCL decides."""
    override_protocol: str | None = knob("RCCL_OVERRIDE_PROTO", tokens="protocol", single=True)
    """``RCCL_OVERRIDE_PROTO`` (RCCL >= 2.26.6): forces one protocol outright (LL, LL128, Simple)."""
    override_algorithm: str | None = knob("RCCL_OVERRIDE_ALGO", tokens="algorithm", single=True)
    """``RCCL_OVERRIDE_ALGO`` (RCCL >= 2.26.6): forces one algorithm outright (Ring, Tree)."""
    ll128_force_enable: bool | None = knob("RCCL_LL128_FORCE_ENABLE")
    """``RCCL_LL128_FORCE_ENABLE``: RCCL 2.21.5 enables LL128 only on gfx90a nodes whose topology model
    does (16 GCDs + 8 NICs) or when forced; on gfx942 the flag does nothing before ROCm 6.4.2 (skipped
    there with a warning)."""

    # -- channels, buffers, thresholds --
    min_channels: int | None = knob("NCCL_MIN_NCHANNELS", between=(1, 256))
    """``NCCL_MIN_NCHANNELS`` (AMD: 112 for MI300X end-to-end runs on 8 GPUs; RCCL 2.21.5 already applies
    its own MI300X minimums for 2 and 4 ranks). Setting it bypasses RCCL's own MI300X channel model
    (RCCL >= 2.26.6)."""
    max_channels: int | None = knob("NCCL_MAX_NCHANNELS", between=(1, 256))
    """``NCCL_MAX_NCHANNELS``."""
    buffsize_bytes: int | None = knob("NCCL_BUFFSIZE", positive=True)
    """``NCCL_BUFFSIZE`` (default 4 MiB)."""
    ll_buffsize_bytes: int | None = knob("NCCL_LL_BUFFSIZE", positive=True)
    """``NCCL_LL_BUFFSIZE``."""
    ll128_buffsize_bytes: int | None = knob("NCCL_LL128_BUFFSIZE", positive=True)
    """``NCCL_LL128_BUFFSIZE``."""
    p2p_ll_threshold_bytes: int | None = knob("NCCL_P2P_LL_THRESHOLD", positive=True)
    """``NCCL_P2P_LL_THRESHOLD``: point-to-point only (default 16384). There is no LL threshold for
    collectives (``RCCL_LL_THRESHOLD``/``NCCL_LL_THRESHOLD`` do not exist / are dead)."""
    p2p_net_threshold_bytes: int | None = knob("RCCL_P2P_NET_THRESHOLD", positive=True)
    """``RCCL_P2P_NET_THRESHOLD`` (default 131072)."""
    intranet_threshold_bytes: int | None = knob("RCCL_INTRANET_THRESHOLD", positive=True)
    """``RCCL_INTRANET_THRESHOLD`` (default 8388608)."""

    # -- MSCCL / memory --
    msccl_enable: bool | None = knob("RCCL_MSCCL_ENABLE")
    """``RCCL_MSCCL_ENABLE`` (AMD images set 0). Removed with MSCCL in RCCL 2.28.3, listed under ROCm
    7.13 (ROCm 7.11-7.13 all ship 2.28.3): skipped with a warning from ROCm 7.13."""
    mscclpp_enable: bool | None = knob("RCCL_MSCCLPP_ENABLE")
    """``RCCL_MSCCLPP_ENABLE`` (AMD docs misspell it ``RCCL_ENABLE_MSCCLPP``). MSCCL++ is off at build
    time since RCCL 2.27.7 / ROCm 7.1.0 and the variable was removed in RCCL 2.28.3: skipped from ROCm
    7.1."""
    cumem_enable: bool | None = knob("NCCL_CUMEM_ENABLE")
    """``NCCL_CUMEM_ENABLE`` (ignored by RCCL 2.21.5). A Broadcom Thor2 requirement for it is
    unverified: no preset sets it."""

    # -- network (multi-node) --
    ib_hca: str | None = knob("NCCL_IB_HCA")
    """``NCCL_IB_HCA``: which RDMA NICs, e.g. ``"mlx5_0,mlx5_1"`` or ``"=bnxt_re0"``."""
    ib_gid_index: int | None = knob("NCCL_IB_GID_INDEX", between=(0, 255))
    """``NCCL_IB_GID_INDEX``. Unset (None) is RCCL's default: -1 from RCCL 2.21.5 (ROCm 6.3), which
    selects the RoCE v2 GID itself (RCCL ``src/transport/net_ib.cc``), GID 0 before. Set it when
    ``NCCL_DEBUG=INFO`` shows a wrong pick, or on RoCE with RCCL <= 2.20."""
    ib_timeout: int | None = knob("NCCL_IB_TIMEOUT", between=(1, 31))
    """``NCCL_IB_TIMEOUT`` (exponent: 4.096 us * 2**value; RCCL default 18)."""
    ib_retry_cnt: int | None = knob("NCCL_IB_RETRY_CNT", between=(0, 7))
    """``NCCL_IB_RETRY_CNT`` (default 7)."""
    socket_ifname: str | None = knob("NCCL_SOCKET_IFNAME")
    """``NCCL_SOCKET_IFNAME``: bootstrap/socket interface, e.g. ``"eth0"`` or ``"^lo,docker"``."""
    net_gdr_level: str | None = knob(
        "NCCL_NET_GDR_LEVEL",
        choices=("LOC", "PIX", "PXB", "PHB", "SYS", "0", "1", "2", "3", "4", "5"),
    )
    """``NCCL_NET_GDR_LEVEL``: LOC, PIX, PXB, PHB, SYS (or 0-5)."""
    cross_nic: int | None = knob("NCCL_CROSS_NIC", between=(0, 2))
    """``NCCL_CROSS_NIC``: 0, 1 or 2."""

    # -- debug --
    debug: str | None = knob(
        "NCCL_DEBUG", choices=("NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE")
    )
    """``NCCL_DEBUG``: NONE (documented since RCCL 2.27.7), VERSION, WARN, INFO, ABORT or TRACE."""
    debug_subsys: str | None = knob("NCCL_DEBUG_SUBSYS")
    """``NCCL_DEBUG_SUBSYS``, e.g. ``"INIT,COLL"``."""
    debug_file: str | None = knob("NCCL_DEBUG_FILE")
    """``NCCL_DEBUG_FILE``, e.g. ``"/tmp/nccl.%h.%p.log"``."""

    # -- comm/compute overlap --
    high_priority_streams: bool | None = knob("TORCH_NCCL_HIGH_PRIORITY", side="pg")
    """``TORCH_NCCL_HIGH_PRIORITY``: high-priority comm streams (AMD pairs it with GPU_MAX_HW_QUEUES=2)."""
    gpu_max_hw_queues: int | None = knob("GPU_MAX_HW_QUEUES", between=(1, 32))
    """``GPU_MAX_HW_QUEUES`` (HIP, default 4)."""

    # -- how to apply --
    force: bool = False
    """Override values already present in the user's environment (otherwise the user's value wins)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Other real env vars to set, e.g. ``{HSA_NO_SCRATCH_RECLAIM: "1"}``. Validated against the
    registry: an invented or dead name is an error."""

    # -- process-group timeouts (two phases; the watchdog helper switches after step 1) --
    init_timeout_seconds: float = 300.0
    """Process-group timeout for initialisation and the first step: also bounds the wait for peers
    at the rendezvous (the error then says how many ranks arrived). 300 s as torchtitan; the GPU
    recipes, whose first step compiles, raise it."""
    train_timeout_seconds: float = 600.0
    """Process-group timeout after the first step (steady state)."""

    # -- PyTorch ProcessGroupNCCL error handling + flight recorder --
    async_error_handling: int | None = knob(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", default=3, side="pg", between=(0, 3)
    )
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING``: 3 = tear down without abort (flight-recorder dumps need
    3); 1 = abort the communicator and the process. None leaves PyTorch's default."""
    blocking_wait: bool | None = knob("TORCH_NCCL_BLOCKING_WAIT", side="pg")
    """``TORCH_NCCL_BLOCKING_WAIT``: ``wait()`` blocks and raises on timeout."""
    enable_monitoring: bool | None = knob("TORCH_NCCL_ENABLE_MONITORING", side="pg")
    """``TORCH_NCCL_ENABLE_MONITORING``: watchdog-thread liveness monitor."""
    heartbeat_timeout_seconds: int | None = knob(
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", side="pg", positive=True
    )
    """``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (PyTorch default 480)."""
    desync_debug: bool | None = knob("TORCH_NCCL_DESYNC_DEBUG", side="pg")
    """``TORCH_NCCL_DESYNC_DEBUG``: names the culprit rank of a desync."""
    flight_recorder_entries: int = knob("TORCH_FR_BUFFER_SIZE", default=2000, side="pg")
    """``TORCH_FR_BUFFER_SIZE`` on PyTorch >= 2.8, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before (2.7 reads only
    that name): collectives remembered per rank; 0 disables the flight recorder."""
    dump_on_timeout: bool = knob("TORCH_NCCL_DUMP_ON_TIMEOUT", default=True, side="pg")
    """``TORCH_NCCL_DUMP_ON_TIMEOUT``: write the flight recorder when a collective times out."""
    flight_recorder_dump_prefix: str | None = knob("TORCH_FR_DUMP_TEMP_FILE", side="pg")
    """``TORCH_FR_DUMP_TEMP_FILE`` on PyTorch >= 2.8, ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` before: dump path
    prefix, the rank is appended. None: ``<run_dir>/flight_recorder/rank_`` when a run directory is known. Analyse with
    ``torchfrtrace DIR --prefix rank_``."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field; the fix lists every problem.

        Only what holds on every platform is checked here; what depends on the running RCCL,
        ROCm or PyTorch (version gates, AMD-only algorithms) is warned about when applied."""
        problems = config_errors(self)
        if problems:
            name, value, _ = problems[0]
            raise ConfigError(f"rccl.{name}", value, "; ".join(text for _, _, text in problems))


def _type_ok(value: Any, hint: str) -> str | None:
    """The expected type's name when ``value`` does not match the annotation ``hint``."""
    for kind in (bool, int, float, str, dict):
        if value is None or not hint.startswith(kind.__name__):
            continue
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        return None if ok else kind.__name__
    return None


def config_errors(cfg: RcclConfig) -> list[tuple[str, Any, str]]:
    """Every platform-independent problem of ``cfg``: ``(field, value, message)``."""
    from rocmtrain.comms import registry

    token_sets = {
        "protocol": registry.PROTO_TOKENS,
        "algorithm": registry.ALGO_TOKENS + registry.ALGO_TOKENS_OTHER,
    }
    out: list[tuple[str, Any, str]] = []
    values = {f.name: getattr(cfg, f.name) for f in fields(RcclConfig)}

    def bad(name: str, text: str) -> None:
        out.append((name, values[name], f"rccl.{name}={values[name]!r}: {text}"))

    for f in fields(RcclConfig):
        expected = _type_ok(values[f.name], str(f.type))
        if expected is not None:
            bad(f.name, f"expected {expected}")
            values[f.name] = None  # its domain is not checked on a value of the wrong type
    for f in fields(RcclConfig):
        value, meta = values[f.name], f.metadata
        if value is None or "env" not in meta:
            continue
        if meta["tokens"]:
            allowed = token_sets[meta["tokens"]]
            try:
                toks = registry.parse_token_list(
                    value, field=f"rccl.{f.name}", allowed=allowed, allow_exclude=not meta["single"]
                )
            except ValueError as exc:
                out.append((f.name, value, str(exc)))
                continue
            if meta["single"] and len(toks) != 1:
                bad(f.name, f"give exactly one of {', '.join(allowed)}")
        if meta["choices"] and str(value).upper() not in meta["choices"]:
            bad(f.name, f"allowed values are {', '.join(meta['choices'])}")
        if meta["between"] and not meta["between"][0] <= int(value) <= meta["between"][1]:
            bad(f.name, "must be between {} and {}".format(*meta["between"]))
        if meta["positive"] and int(value) <= 0:
            bad(f.name, "must be a positive integer")
    out += _cross_field_errors(cfg, values)
    return out


def _cross_field_errors(cfg: RcclConfig, values: dict[str, Any]) -> list[tuple[str, Any, str]]:
    out: list[tuple[str, Any, str]] = []
    lo, hi = values["min_channels"], values["max_channels"]
    if lo and hi and lo > hi:
        out.append(("min_channels", lo, f"rccl.min_channels={lo} > rccl.max_channels={hi}: "
                    "lower min_channels or raise max_channels"))  # fmt: skip
    for name in ("init_timeout_seconds", "train_timeout_seconds"):
        value = values[name]
        if value is not None and not value > 0:
            out.append((name, value, f"rccl.{name}={value!r}: must be > 0 seconds"))
    entries = values["flight_recorder_entries"]
    if entries is not None and entries < 0:
        out.append(("flight_recorder_entries", entries, f"rccl.flight_recorder_entries={entries}: "
                    "must be >= 0 (0 disables the flight recorder)"))  # fmt: skip
    by_env = {env: name for name, env in env_fields().items()}
    for key, value in (values["extra_env"] or {}).items():
        if key in by_env:
            out.append(("extra_env", cfg.extra_env, f"rccl.extra_env.{key}={value!r}: use the "
                        f"typed field rccl.{by_env[key]}"))  # fmt: skip
    return out

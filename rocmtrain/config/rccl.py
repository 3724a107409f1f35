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

from dataclasses import dataclass, field


@dataclass
class RcclConfig:
    """Collective-library knobs applied before the process group exists, and PG timeouts."""

    # -- protocol / algorithm (unset = RCCL's own tuning model) --
    protocol: str | None = None
    """``NCCL_PROTO``: comma list of LL, LL128, Simple (case-insensitive), leading ``^`` = all except;
    per collective ``"allreduce:simple;broadcast:ll"`` with RCCL/NCCL >= 2.24.3. None leaves RCCL's
    tuner in charge (recommended unless a sweep says otherwise)."""
    algorithm: str | None = None
    """``NCCL_ALGO``: Ring or Tree on AMD (comma list, ``^`` allowed; per collective
    ``"allreduce:tree;broadcast:ring"`` with RCCL/NCCL >= 2.24.3). None = RCCL decides."""
    override_protocol: str | None = None
    """``RCCL_OVERRIDE_PROTO`` (RCCL >= 2.26.6): forces one protocol outright (LL, LL128, Simple)."""
    override_algorithm: str | None = None
    """``RCCL_OVERRIDE_ALGO`` (RCCL >= 2.26.6): forces one algorithm outright (Ring, Tree)."""
    ll128_force_enable: bool | None = None
    """``RCCL_LL128_FORCE_ENABLE``: RCCL 2.21.5 enables LL128 only on gfx90a nodes whose topology model
    does (16 GCDs + 8 NICs) or when forced; on gfx942 the flag does nothing before ROCm 6.4.2 (skipped
    there with a warning)."""

    # -- channels, buffers, thresholds --
    min_channels: int | None = None
    """``NCCL_MIN_NCHANNELS`` (AMD: 112 for MI300X end-to-end runs on 8 GPUs; RCCL 2.21.5 already applies
    its own MI300X minimums for 2 and 4 ranks). Setting it bypasses RCCL's own MI300X channel model
    (RCCL >= 2.26.6)."""
    max_channels: int | None = None
    """``NCCL_MAX_NCHANNELS``."""
    buffsize_bytes: int | None = None
    """``NCCL_BUFFSIZE`` (default 4 MiB)."""
    ll_buffsize_bytes: int | None = None
    """``NCCL_LL_BUFFSIZE``."""
    ll128_buffsize_bytes: int | None = None
    """``NCCL_LL128_BUFFSIZE``."""
    p2p_ll_threshold_bytes: int | None = None
    """``NCCL_P2P_LL_THRESHOLD``: point-to-point only (default 16384). There is no LL threshold for
    collectives (``RCCL_LL_THRESHOLD``/``NCCL_LL_THRESHOLD`` do not exist / are dead)."""
    p2p_net_threshold_bytes: int | None = None
    """``RCCL_P2P_NET_THRESHOLD`` (default 131072)."""
    intranet_threshold_bytes: int | None = None
    """``RCCL_INTRANET_THRESHOLD`` (default 8388608)."""

    # -- MSCCL / memory --
    msccl_enable: bool | None = None
    """``RCCL_MSCCL_ENABLE`` (AMD images set 0). Removed with MSCCL in RCCL 2.28.3, listed under ROCm
    7.13 (ROCm 7.11-7.13 all ship 2.28.3): skipped with a warning from ROCm 7.13."""
    mscclpp_enable: bool | None = None
    """``RCCL_MSCCLPP_ENABLE`` (AMD docs misspell it ``RCCL_ENABLE_MSCCLPP``). MSCCL++ is off at build
    time since RCCL 2.27.7 / ROCm 7.1.0 and the variable was removed in RCCL 2.28.3: skipped from ROCm
    7.1."""
    cumem_enable: bool | None = None
    """``NCCL_CUMEM_ENABLE`` (ignored by RCCL 2.21.5). A Broadcom Thor2 requirement for it is
    unverified: no preset sets it."""

    # -- network (multi-node) --
    ib_hca: str | None = None
    """``NCCL_IB_HCA``: which RDMA NICs, e.g. ``"mlx5_0,mlx5_1"`` or ``"=bnxt_re0"``."""
    ib_gid_index: int | None = None
    """``NCCL_IB_GID_INDEX``. Unset (None) is RCCL's default: -1 from RCCL 2.21.5 (ROCm 6.3), which
    selects the RoCE v2 GID itself (RCCL ``src/transport/net_ib.cc``), GID 0 before. Set it when
    ``NCCL_DEBUG=INFO`` shows a wrong pick, or on RoCE with RCCL <= 2.20."""
    ib_timeout: int | None = None
    """``NCCL_IB_TIMEOUT`` (exponent: 4.096 us * 2**value; RCCL default 18)."""
    ib_retry_cnt: int | None = None
    """``NCCL_IB_RETRY_CNT`` (default 7)."""
    socket_ifname: str | None = None
    """``NCCL_SOCKET_IFNAME``: bootstrap/socket interface, e.g. ``"eth0"`` or ``"^lo,docker"``."""
    net_gdr_level: str | None = None
    """``NCCL_NET_GDR_LEVEL``: LOC, PIX, PXB, PHB, SYS (or 0-5)."""
    cross_nic: int | None = None
    """``NCCL_CROSS_NIC``: 0, 1 or 2."""

    # -- debug --
    debug: str | None = None
    """``NCCL_DEBUG``: NONE (documented since RCCL 2.27.7), VERSION, WARN, INFO, ABORT or TRACE."""
    debug_subsys: str | None = None
    """``NCCL_DEBUG_SUBSYS``, e.g. ``"INIT,COLL"``."""
    debug_file: str | None = None
    """``NCCL_DEBUG_FILE``, e.g. ``"/tmp/nccl.%h.%p.log"``."""

    # -- comm/compute overlap --
    high_priority_streams: bool | None = None
    """``TORCH_NCCL_HIGH_PRIORITY``: high-priority comm streams (AMD pairs it with GPU_MAX_HW_QUEUES=2)."""
    gpu_max_hw_queues: int | None = None
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
    async_error_handling: int | None = 3
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING``: 3 = tear down without abort (flight-recorder dumps need
    3); 1 = abort the communicator and the process. None leaves PyTorch's default."""
    blocking_wait: bool | None = None
    """``TORCH_NCCL_BLOCKING_WAIT``: ``wait()`` blocks and raises on timeout."""
    enable_monitoring: bool | None = None
    """``TORCH_NCCL_ENABLE_MONITORING``: watchdog-thread liveness monitor."""
    heartbeat_timeout_seconds: int | None = None
    """``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (PyTorch default 480)."""
    desync_debug: bool | None = None
    """``TORCH_NCCL_DESYNC_DEBUG``: names the culprit rank of a desync."""
    flight_recorder_entries: int = 2000
    """``TORCH_FR_BUFFER_SIZE`` on PyTorch >= 2.8, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before (2.7 reads only
    that name): collectives remembered per rank; 0 disables the flight recorder."""
    dump_on_timeout: bool = True
    """``TORCH_NCCL_DUMP_ON_TIMEOUT``: write the flight recorder when a collective times out."""
    flight_recorder_dump_prefix: str | None = None
    """``TORCH_FR_DUMP_TEMP_FILE`` on PyTorch >= 2.8, ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` before: dump path
    prefix, the rank is appended. None: ``<run_dir>/flight_recorder/rank_`` when a run directory is known. Analyse with
    ``torchfrtrace DIR --prefix rank_``."""

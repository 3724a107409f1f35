"""``TableBatchedEmbeddingBags``: pooled lookups over many tables with the optimizer fused in backward.

Usage::

    from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags
    tbe = TableBatchedEmbeddingBags(
        [(1_000_000, 128), (5_000, 64)], feature_table_map=[0, 0, 1],
        optimizer=OptimizerSpec(kind="rowwise_adagrad", lr=0.01), device="cuda")
    out = tbe(kjt.values(), kjt.offsets())       # [B, 128 + 128 + 64]
    loss(out).backward()                         # updates tbe.weights in place, no .grad

Backends: ``"triton"`` (GPU kernels of this package; on CPU only under ``TRITON_INTERPRET=1``),
``"torch"`` (pure-torch reference, same semantics), ``"auto"`` (triton on a GPU, torch on CPU).
Shapes and the jagged layout: :mod:`rocmtrain.kernels.layout`. Semantics: ``KERNELS.md``.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from . import reference
from .layout import TBELayout
from .optim import OptimizerSpec, state_numel

Pooling = Literal["sum", "mean"]
BackendName = Literal["auto", "triton", "torch"]
GraphMode = Literal["auto"] | bool
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GRAPH_MODES = ("auto", True, False)
_GRAPH_ENV = {"auto": "auto", "1": True, "0": False}
_log = logging.getLogger(__name__)


def check_bounds_check_every(value: Any, name: str = "bounds_check_every") -> int:
    """``value`` if it is an int >= 1, else a ``ValueError`` naming ``name``, the value and the fix."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}={value!r}: use an int >= 1 (1 = check every batch before the lookup, with a "
            f"host sync; k = count bad ids on the device, read the count every k-th forward)"
        )
    return value


def _resolve_graph_mode(cuda_graph) -> str | bool:
    """``cuda_graph`` argument (None: ``ROCMTRAIN_TBE_CUDA_GRAPH``, unset = "auto") -> mode."""
    if cuda_graph is None:
        env = os.environ.get("ROCMTRAIN_TBE_CUDA_GRAPH", "auto").strip().lower()
        if env not in _GRAPH_ENV:
            raise ValueError(
                f"ROCMTRAIN_TBE_CUDA_GRAPH={env!r}: use one of {sorted(_GRAPH_ENV)} "
                "('auto': graph replay once an input signature repeats; '1': always; '0': never)"
            )
        return _GRAPH_ENV[env]
    if isinstance(cuda_graph, str) and cuda_graph == "auto":
        return "auto"
    if isinstance(cuda_graph, bool):
        return cuda_graph
    raise ValueError(
        f"cuda_graph={cuda_graph!r}: use one of {_GRAPH_MODES} or None (the environment "
        "variable ROCMTRAIN_TBE_CUDA_GRAPH, default 'auto')"
    )


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend={backend!r}: use 'auto', 'triton' or 'torch'")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend='triton' on device {device}: Triton needs a GPU; on CPU set "
            "TRITON_INTERPRET=1 (slow, for tests) or use backend='torch'"
        )
    return backend


@functools.cache
def _triton_forward():
    """The Triton forward, imported on first use: importing this module (CPU, torch backend)
    does not import Triton, and a call does not pay for an import statement."""
    from .tbe_forward import forward

    return forward


class _TBEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, anchor, indices, offsets, psw):  # type: ignore[override]
        ctx.module = module
        ctx.save_for_backward(indices, offsets, psw)
        ctx.has_psw = psw is not None
        return module._forward_impl(indices, offsets, psw)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        indices, offsets, psw = ctx.saved_tensors
        need_psw_grad = ctx.has_psw and ctx.needs_input_grad[4]
        dpsw = ctx.module._backward_impl(grad_out, indices, offsets, psw, need_psw_grad)
        return None, None, None, None, dpsw


class TableBatchedEmbeddingBags(nn.Module):
    """Pooled embedding bags over many tables in one flat buffer, with a fused sparse optimizer.

    ``forward(indices, offsets, per_sample_weights=None) -> [B, sum_f D_f]`` takes a
    KeyedJaggedTensor's ``values()`` and ``offsets()`` (key-major, ``F*B + 1`` offsets, int32 or
    int64). ``backward`` updates the touched rows of ``weights`` in place (EXACT SGD, rowwise
    Adagrad or Adam, fp32 state) and returns the gradient of ``per_sample_weights``; ``weights``
    never receives a ``.grad``. Under ``torch.no_grad()`` or without ``backward`` nothing changes.

    Bounds check (``bounds_check=True``): out-of-range or negative indices are never read or
    updated (they pool as zeros). ``bounds_check_every=1`` checks every batch before the lookup
    (one host sync per forward) and raises an ``IndexError`` naming the feature, table, index
    and sample. ``bounds_check_every=k > 1`` counts bad indices on the device during the lookup
    (no host sync) and reads the count every k-th forward (one sync per k): a bad id is reported
    within k steps, by name if it is in the batch of that forward, else by count.
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        *,
        feature_table_map: Sequence[int] | None = None,
        optimizer: OptimizerSpec = OptimizerSpec(),  # noqa: B008 (frozen dataclass)
        weights_dtype: torch.dtype = torch.float32,
        output_dtype: torch.dtype = torch.float32,
        pooling: Pooling = "sum",
        backend: BackendName = "auto",
        bounds_check: bool = True,
        bounds_check_every: int = 1,
        deterministic: bool = False,
        stochastic_rounding: bool = True,
        seed: int = 0,
        cuda_graph: GraphMode | None = None,
        pooling_factors: Sequence[float] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.layout = TBELayout.build(tables, feature_table_map=feature_table_map)
        if weights_dtype not in _DTYPES:
            raise ValueError(f"weights_dtype={weights_dtype}: use one of {_DTYPES}")
        if output_dtype not in _DTYPES:
            raise ValueError(f"output_dtype={output_dtype}: use one of {_DTYPES}")
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling={pooling!r}: use 'sum' or 'mean'")
        if not isinstance(optimizer, OptimizerSpec):
            raise TypeError(f"optimizer must be an OptimizerSpec, got {type(optimizer).__name__}")
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.optimizer = optimizer
        self.output_dtype = output_dtype
        self.pooling = pooling
        self.backend_name = backend
        _resolve_backend(backend, device)  # validate now, resolve per call (module may move)
        self.bounds_check = bounds_check
        self.bounds_check_every = check_bounds_check_every(bounds_check_every)
        self._bad: torch.Tensor | None = None  # deferred check: bad ids since the last read
        self._since_check = 0
        self.deterministic = deterministic
        self.stochastic_rounding = stochastic_rounding
        self.seed = int(seed)
        self.step = 0  #: optimizer steps applied (Adam bias correction, rounding noise stream)
        # Triton backward replayed from a CUDA / HIP graph per static input signature: removes
        # the host cost of its launches. "auto" (default): inputs up to _AUTO_MAX_GRAPH_BYTES
        # (larger ones run eagerly), captured once a signature repeats on consecutive calls, at
        # most _MAX_GRAPHS graphs, eager again after _AUTO_MAX_SIGNATURES distinct signatures
        # (variable-length batches); True: capture every signature; False: never. No effect on
        # CPU / in the interpreter. The environment variable ROCMTRAIN_TBE_CUDA_GRAPH
        # (auto / 1 / 0) sets it for modules built without the argument.
        self.cuda_graph: str | bool = _resolve_graph_mode(cuda_graph)
        # mean bag length per feature (e.g. MLPerf's multi-hot sizes; None: measured on the
        # first batch): one-hot and multi-hot features are launched with their own tiles
        if pooling_factors is not None and len(pooling_factors) != self.layout.num_features:
            raise ValueError(
                f"pooling_factors has {len(pooling_factors)} entries; it needs one mean bag "
                f"length per feature ({self.layout.num_features})"
            )
        self.pooling_factors = list(pooling_factors) if pooling_factors is not None else None
        self._groups: dict[torch.device, list] = {}
        self._graphs: OrderedDict[tuple, Any] = OrderedDict()
        self._graph_pool: tuple[str, Any] | None = None  # (device, pool handle) all graphs share
        self._sig_last: tuple | None = None  # "auto": the previous call's signature
        self._sigs_seen: set[tuple] = set()  # "auto": distinct signatures so far (bounded)
        self._scal: torch.Tensor | None = None
        self._scal_vals: tuple | None = None  # the values now in self._scal
        self._anchor: torch.Tensor | None = None
        lay = self.layout
        gen = torch.Generator(device=device).manual_seed(self.seed)
        w = torch.empty(lay.total_weights, dtype=torch.float32, device=device)
        for t in range(lay.num_tables):  # torchrec's default init: U(-sqrt(1/rows), sqrt(1/rows))
            bound = (1.0 / lay.table_rows[t]) ** 0.5
            lo, hi = lay.weights_offsets[t], lay.weights_offsets[t + 1]
            w[lo:hi].uniform_(-bound, bound, generator=gen)
        self.weights = nn.Parameter(w.to(weights_dtype), requires_grad=False)
        for name in optimizer.state_names:
            numel = sum(
                state_numel(optimizer, r, d)
                for r, d in zip(lay.table_rows, lay.table_dims, strict=True)
            )
            self.register_buffer(name, torch.zeros(numel, dtype=torch.float32, device=device))

    # ------------------------------------------------------------------ public API
    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check_args(indices, offsets, per_sample_weights)
        if self.bounds_check and self.bounds_check_every == 1:
            reference.check_inputs(self.layout, indices, offsets)
        if torch.is_grad_enabled():
            # one empty leaf that requires grad makes the output require grad whatever the
            # inputs do; it never receives a gradient, so one per module (and device) serves
            anchor = self._anchor
            if anchor is None or anchor.device != self.weights.device:
                anchor = self._anchor = torch.empty(0, device=self.weights.device,
                                                    requires_grad=True)  # fmt: skip
            out = _TBEFunction.apply(self, anchor, indices, offsets, per_sample_weights)
        else:
            out = self._forward_impl(indices, offsets, per_sample_weights)
        if self._deferred_check:
            self._read_bad_count(indices, offsets)
        return out

    @property
    def _deferred_check(self) -> bool:
        return self.bounds_check and self.bounds_check_every > 1

    def _bad_counter(self) -> torch.Tensor | None:
        """The device counter the lookup adds bad ids to (deferred check), else None."""
        if not self._deferred_check:
            return None
        dev = self.weights.device
        if self._bad is None or self._bad.device != dev:
            self._bad = torch.zeros(1, dtype=torch.int32, device=dev)
        return self._bad

    def _read_bad_count(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Every ``bounds_check_every``-th forward: one host sync reads the device count."""
        self._since_check += 1
        if self._since_check < self.bounds_check_every:
            return
        every, self._since_check = self._since_check, 0
        bad = self._bad_counter()
        n = int(bad.item()) if bad is not None else 0
        if n == 0:
            return
        bad.zero_()
        reference.check_inputs(self.layout, indices, offsets)  # names it if in this batch
        raise IndexError(
            f"{n} embedding indices out of range or negative in the last {every} forwards (they "
            f"pooled as zeros and no row was updated); this batch has none. Fix the input ids "
            f"(hash or clamp them to the table size), or set bounds_check_every=1 to stop at the "
            f"first bad batch with its feature, table, index and sample named."
        )

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """Per-table ``[rows, D]`` views into :attr:`weights` (writes go to the module)."""
        lay = self.layout
        return [
            self.weights.data[lay.weights_offsets[t] : lay.weights_offsets[t + 1]].view(
                lay.table_rows[t], lay.table_dims[t]
            )
            for t in range(lay.num_tables)
        ]

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per-table fp32 optimizer state views: ``{"momentum": [rows]}`` for rowwise Adagrad,
        ``{"exp_avg": [rows, D], "exp_avg_sq": [rows, D]}`` for Adam, ``{}`` for SGD."""
        lay = self.layout
        out: list[dict[str, torch.Tensor]] = []
        for t in range(lay.num_tables):
            rows, dim = lay.table_rows[t], lay.table_dims[t]
            d: dict[str, torch.Tensor] = {}
            for name in self.optimizer.state_names:
                buf = getattr(self, name)
                if self.optimizer.kind == "rowwise_adagrad":
                    d[name] = buf[lay.row_offsets[t] : lay.row_offsets[t + 1]]
                else:
                    lo, hi = lay.weights_offsets[t], lay.weights_offsets[t + 1]
                    d[name] = buf[lo:hi].view(rows, dim)
            out.append(d)
        return out

    def states(self) -> dict[str, torch.Tensor]:
        """The flat fp32 optimizer buffers by name."""
        return {name: getattr(self, name) for name in self.optimizer.state_names}

    def get_extra_state(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.seed = int(state["seed"])

    def extra_repr(self) -> str:
        lay = self.layout
        return (
            f"tables={list(zip(lay.table_rows, lay.table_dims, strict=True))}, features={lay.num_features}, "
            f"optimizer={self.optimizer.kind}, weights_dtype={self.weights.dtype}, "
            f"pooling={self.pooling}, backend={self.backend_name}"
        )

    # ------------------------------------------------------------------ internals
    @property
    def backend(self) -> str:
        """The backend used on the module's current device."""
        return _resolve_backend(self.backend_name, self.weights.device)

    def _check_args(self, indices, offsets, psw) -> None:
        dev = self.weights.device
        for name, t in (("indices", indices), ("offsets", offsets)):
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device} but the weights are on {dev}")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        self.layout.batch_size(offsets)
        if psw is not None:
            if psw.shape != indices.shape:
                raise ValueError(
                    f"per_sample_weights has shape {tuple(psw.shape)}; it needs one weight per "
                    f"index, shape {tuple(indices.shape)}"
                )
            if not psw.is_floating_point() or psw.device != dev:
                raise ValueError(f"per_sample_weights must be a float tensor on {dev}")

    def _forward_impl(self, indices, offsets, psw) -> torch.Tensor:
        if self.backend == "triton":
            groups = self._feature_groups(offsets)
            return _triton_forward()(
                self.layout,
                self.weights.data,
                indices,
                offsets,
                psw,
                pooling=self.pooling,
                output_dtype=self.output_dtype,
                groups=groups,
                bad_count=self._bad_counter(),
            )
        return reference.forward(
            self.layout,
            self.weights.data,
            indices,
            offsets,
            psw,
            pooling=self.pooling,
            output_dtype=self.output_dtype,
            bad_count=self._bad_counter(),
        )

    def _feature_groups(self, offsets) -> list[tuple] | None:
        """One-hot / multi-hot feature groups on this device, each launched with its own tile:
        from ``pooling_factors`` when given, else from the first non-empty batch's bag lengths."""
        dev = self.weights.device
        groups = self._groups.get(dev)
        if groups is None:
            from .tbe_forward import feature_groups, measured_pooling_factors

            pf = self.pooling_factors or measured_pooling_factors(self.layout, offsets)
            if pf is None:  # empty batch: nothing to measure yet
                return None
            groups = self._groups[dev] = feature_groups(self.layout, pf, dev)
        return groups

    def _backward_impl(self, grad_out, indices, offsets, psw, need_psw_grad):
        self.step += 1
        seed = (self.seed * 1_000_003 + self.step) % (2**31 - 1)
        sr = self.stochastic_rounding and self.weights.dtype != torch.float32
        kw = dict(
            pooling=self.pooling,
            spec=self.optimizer,
            step=self.step,
            stochastic_rounding=sr,
            need_psw_grad=need_psw_grad,
            deterministic=self.deterministic,
        )
        if self.backend == "triton":
            from .tbe_backward import _SCAL_LEN, scalar_values, write_scalars
            from .tbe_backward import backward_update as triton_backward

            dev = self.weights.device
            if self._scal is None or self._scal.device != dev:
                self._scal = torch.empty(_SCAL_LEN, dtype=torch.float32, device=dev)
                self._scal_vals = None
            # the values change per step only for Adam (bias corrections) and stochastic
            # rounding (seed); otherwise the device copy from the first step stays valid
            vals = scalar_values(self.optimizer, self.step, seed, stochastic_rounding=sr)
            if vals != self._scal_vals:
                write_scalars(self._scal, vals)
                self._scal_vals = vals
            args = (grad_out, indices, offsets, psw)
            kw["groups"] = self._groups.get(dev)
            done = False
            if self.cuda_graph is not False and dev.type == "cuda":
                done, dpsw = self._graphed_backward(triton_backward, args, seed=seed, **kw)
            if not done:
                dpsw = triton_backward(self.layout, self.weights.data, self.states(), *args,
                                       seed=seed, scal=self._scal, **kw)  # fmt: skip
        else:
            gen = torch.Generator(device=self.weights.device).manual_seed(seed)
            dpsw = reference.backward_update(
                self.layout, self.weights.data, self.states(), grad_out, indices, offsets,
                psw, generator=gen, **kw,
            )  # fmt: skip
        if dpsw is not None and psw is not None:
            dpsw = dpsw.to(psw.dtype)
        return dpsw

    _MAX_GRAPHS = 4  #: captured backward graphs kept per module (least recently used dropped)
    _AUTO_MAX_SIGNATURES = 16  #: "auto": distinct input signatures before it stays eager
    #: "auto": largest backward input (gradient, indices, offsets, per-sample weights) replayed
    #: from a graph. A replay first copies its inputs into the graph's static buffers: at 64 MiB
    #: that is ~30 us of an H200's copy bandwidth (~80 us on an MI250X) against the ~0.2 ms of
    #: host launches it saves; a larger input means a backward whose GPU time outruns its
    #: launches, where the copy is pure cost (the DLRM-DCNv2 recipe's 0.55 GB of bf16 gradients
    #: and ids per step: ~0.3 ms of copies on an H200).
    _AUTO_MAX_GRAPH_BYTES = 64 << 20

    def _graph_signature(self, args, kw) -> tuple:
        """Everything the captured backward bakes in: input shapes / dtypes (the graph's static
        buffers), the addresses of the weights, optimizer states and scalar tensor (the graph
        writes and reads them in place), and the kernel variant (constexprs, the sort's
        stability). Step-dependent values (lr, bias corrections, rounding seed) are not part of
        it: they reach the graph through ``self._scal``, filled before every replay."""
        grad_out, indices, offsets, psw = args
        return (
            str(self.weights.device), self.weights.data_ptr(), self.weights.dtype,
            tuple(t.data_ptr() for t in self.states().values()), self._scal.data_ptr(),
            indices.numel(), indices.dtype, offsets.numel(), offsets.dtype,
            tuple(grad_out.shape), grad_out.dtype, psw is not None,
            psw.dtype if psw is not None else None, kw["need_psw_grad"], self.pooling,
            self.deterministic, kw["stochastic_rounding"], self.optimizer.kind,
        )  # fmt: skip

    def _graph_off(self, message: str, *, warn: bool) -> None:
        """Switch graph replay off for this module (eager from now on) and say so, once: a
        Python warning for a failed capture (a backend problem), a log line when "auto" gives
        up on varying shapes (expected for variable-length batches)."""
        if warn:
            warnings.warn(message, stacklevel=4)
        else:
            _log.warning(message)
        self.cuda_graph = False
        self._graphs.clear()
        self._sigs_seen.clear()

    def _graphed_backward(self, triton_backward, args, **kw) -> tuple[bool, Any]:
        """The Triton backward replayed from a graph captured for this input signature.

        Returns ``(True, d psw)`` when it ran the step (graph or static-buffer warm-up) and
        ``(False, None)`` when the caller should run it eagerly on the inputs as they are.

        Per signature: the first graph call copies the inputs into static buffers and runs the
        backward eagerly on them (compiles exactly the kernel specialisations the capture will
        record, sizes the sort's workspace, applies this step); the next captures and replays;
        every call after copies the inputs in and replays. ``cuda_graph=True`` takes that path
        for every signature; ``"auto"`` only for inputs of at most ``_AUTO_MAX_GRAPH_BYTES``
        and once a signature has come twice in a row (a variable-shape workload never pays a
        capture), and gives up after ``_AUTO_MAX_SIGNATURES`` distinct ones. The step's
        optimizer scalars reach the graph through ``self._scal`` (written before each replay
        when they change). All graphs share
        one memory pool: each graph's output is cloned right after its replay, so a later
        replay of another graph reusing that memory cannot clobber anything still read.
        """
        if torch.cuda.is_current_stream_capturing():  # inside the caller's own capture
            return False, None
        grad_out, indices, offsets, psw = args
        nbytes = sum(t.nbytes for t in args if t is not None)
        if self.cuda_graph == "auto" and nbytes > self._AUTO_MAX_GRAPH_BYTES:
            return False, None
        key = self._graph_signature(args, kw)
        entry = self._graphs.get(key)
        if entry is None and self.cuda_graph == "auto":
            repeat = key == self._sig_last
            self._sig_last = key
            if not repeat:
                if key not in self._sigs_seen:
                    self._sigs_seen.add(key)
                    if len(self._sigs_seen) > self._AUTO_MAX_SIGNATURES:
                        self._graph_off(
                            f"TableBatchedEmbeddingBags(cuda_graph='auto'): "
                            f"{len(self._sigs_seen)} distinct backward input signatures (shapes "
                            "vary per batch); graph replay off, the backward runs eagerly from "
                            "now on (pass cuda_graph=False to skip the bookkeeping)",
                            warn=False,
                        )
                return False, None
        else:
            self._sig_last = key
        if entry is not None:
            self._graphs.move_to_end(key)
            static = entry["static"]
            for name, src in zip(("go", "idx", "off", "psw"), args, strict=True):
                if src is not None:
                    static[name].copy_(src)
        else:
            static = {
                "go": grad_out.contiguous().clone(), "idx": indices.clone(),
                "off": offsets.clone(), "psw": psw.clone() if psw is not None else None,
            }  # fmt: skip
            entry = {"static": static, "graph": None, "out": None, "warm": False}
            self._graphs[key] = entry
            while len(self._graphs) > self._MAX_GRAPHS:
                self._graphs.popitem(last=False)

        def run():
            return triton_backward(
                self.layout, self.weights.data, self.states(), static["go"], static["idx"],
                static["off"], static["psw"], scal=self._scal, **kw,
            )  # fmt: skip

        if entry["graph"] is None and entry["warm"]:
            dev = str(self.weights.device)
            if self._graph_pool is None or self._graph_pool[0] != dev:
                self._graph_pool = (dev, torch.cuda.graph_pool_handle())
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._graph_pool[1],
                                      capture_error_mode="thread_local"):  # fmt: skip
                    entry["out"] = run()
                entry["graph"] = graph
            except Exception as e:  # a backend that cannot capture: stay eager, say so once
                self._graph_off(
                    f"TableBatchedEmbeddingBags(cuda_graph={self.cuda_graph!r}): capturing the "
                    f"backward failed ({type(e).__name__}: {e}); running it eagerly from now on",
                    warn=True,
                )
                return True, run()  # nothing ran during the failed capture: this step, eagerly
        if entry["graph"] is None:
            entry["warm"] = True
            out = run()
        else:
            entry["graph"].replay()
            out = entry["out"]
        return True, (out.clone() if out is not None else None)

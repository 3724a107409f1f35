"""Input pipelining for any LightningModule: batch i+1's copy and input all-to-all overlap batch i.

What TorchRec's ``TrainPipelineSparseDist`` does, rearranged around Lightning's own loop so a
module with automatic optimization and a plain ``training_step(self, batch, batch_idx)`` gets it
without owning the data iterator::

    the loader hands out batch k   -> batches k+1, k+2 already fetched, their copies to the
                                      device issued on a side stream (PipelinedLoader)
    strategy.training_step(k)      -> before_step: batch k's input dist is complete (its splits and
                                      tensors all-to-all were issued in step k-1); start batch
                                      k+1's input dist (the splits all-to-all) on a side stream
    module forward(k)              -> each sharded module takes its already-distributed input
    strategy.backward(k)           -> before_backward: batch k+1's tensors all-to-all
    training_step returns          -> after_step

TorchRec finds which part of the batch feeds which sharded module by FX-tracing the model's
``forward(batch)``; a user's ``training_step`` may call anything, so this pipeline learns it from
the first step instead: the KeyedJaggedTensor each sharded module receives is located in the batch
(by its values' storage) and that path is used for every later batch. A module whose input is not
a KeyedJaggedTensor taken unchanged from the batch (split, permuted, built in the step) keeps its
own synchronous input dist, and a warning says so. Every rank runs the same code, so every rank
issues the same collectives in the same order.

The math is untouched (the input dist only moves ids): pipelined and plain runs give bitwise the
same losses. With ``stale_after=n`` (``pipeline=semi_sync``) the embedding work itself overlaps the
dense work, at the price of one step of staleness (TorchRec's semi-synchronous training)::

    before_backward(k)             -> batch k+1's lookup, on the side stream: it reads the tables
                                      before batch k's update (batches k >= n)
    after_backward(k)              -> batch k's embedding backward and fused update, on the side
                                      stream, from the gradient the dense backward left on the
                                      pooled embeddings (a detached leaf)

so on a GPU the lookup of k+1 runs under batch k's dense backward and batch k's embedding backward
under batch k+1's dense forward. Batch k+1 sees the dense update of batch k but not its embedding
update. The side stream keeps every table read and write in program order.

Batches reach ``on_before_batch_transfer`` already on the device. The loader is read
ahead of training (two batches on CPU ranks, as TorchRec's pipeline does; a few more on GPUs, where
two background threads load and copy): a data position counted in ``on_before_batch_transfer``
(``RecDataModule``) stays exact, a loader that counts the batches it hands out itself is that
many ahead at a mid-epoch checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

_MAX_DEPTH = 4
_NOT_FOUND = ()  # a learned path of length 0 means "not pipelined"


@dataclasses.dataclass
class _Dist:
    """One sharded module's input dist of one batch, in flight."""

    features: Any  # the KeyedJaggedTensor handed to input_dist
    ctx: Any
    splits: Any = None  # Awaitable[Awaitable[...]]: after the splits all-to-all was issued
    tensors: Any = None  # Awaitable[...]: after the tensors all-to-all was issued
    data: Any = None  # the distributed input (KJTList), on the dist stream
    pooled: Any = None  # stale_after: the output looked up ahead, its values a detached leaf
    source: Any = None  # ... and the lookup's own output, whose backward updates the tables
    looked_up: Any = None  # event on the dist stream after the lookup (GPU)


@dataclasses.dataclass
class _Staged:
    batch: Any
    copied: Any = None  # event on the copy stream after this batch's copy (GPU)
    dists: dict[str, _Dist] = dataclasses.field(default_factory=dict)


def top_level_sharded_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every TorchRec ``ShardedModule`` not nested in another one; names
    are relative to the user's module (inside DMP and DDP)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardedModule

    if isinstance(model, DistributedModelParallel):
        model = model.module  # unwrapped of DDP

    found: list[tuple[str, nn.Module]] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, ShardedModule):
                found.append((path, child))
            else:
                walk(path + ".", child)

    walk("", model)
    return found


def _values_ptr(kjt: Any) -> int:
    values = kjt.values()
    return values.data_ptr() if values.numel() else -1


def _same_kjt(a: Any, b: Any) -> bool:
    """The same ids (a device copy re-wrapped by ``Batch.to`` keeps the value tensors)."""
    if a is b:
        return True
    return (
        _values_ptr(a) == _values_ptr(b)
        and a.values().numel() == b.values().numel()
        and a.keys() == b.keys()
    )


def _children(obj: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(obj, dict):
        yield from obj.items()
    elif isinstance(obj, (list, tuple)):
        yield from enumerate(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield f.name, getattr(obj, f.name)


def find_kjt(batch: Any, target: Any, depth: int = 0) -> tuple[Any, ...] | None:
    """Path (keys, indices, field names) to ``target``'s KeyedJaggedTensor inside ``batch``."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if isinstance(batch, KeyedJaggedTensor):
        return () if _same_kjt(batch, target) else None
    if depth >= _MAX_DEPTH:
        return None
    for key, child in _children(batch):
        sub = find_kjt(child, target, depth + 1)
        if sub is not None:
            return (key, *sub)
    return None


def follow(batch: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        batch = batch[key] if isinstance(batch, (dict, list, tuple)) else getattr(batch, key)
    return batch


def _on(stream: torch.Stream | None) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _record(obj: Any, stream: torch.Stream | None) -> None:
    """Tell the caching allocator ``obj`` (made on a side stream) is used on ``stream``."""
    if stream is None:
        return
    if hasattr(obj, "record_stream"):  # tensors, KeyedJaggedTensor, torchrec Batch
        obj.record_stream(stream)
    else:
        for _, child in _children(obj):
            _record(child, stream)


def _to_device(batch: Any, device: torch.device) -> Any:
    """``move_data_to_device`` with non-blocking copies for every ``.to`` (Lightning's helper
    passes ``non_blocking`` to plain tensors only: a torchrec ``Batch`` would copy synchronously)."""
    from lightning_fabric.utilities.apply_func import _TransferableDataType
    from lightning_utilities.core.apply_func import apply_to_collection

    if device.type == "cpu":
        return batch

    def to(data: Any) -> Any:
        try:
            out = data.to(device, non_blocking=True)
        except TypeError:  # a .to(device) without non_blocking
            out = data.to(device)
        return data if out is None else out

    return apply_to_collection(batch, dtype=_TransferableDataType, function=to)


class InputPipeline:
    """Stages batches ahead and pre-distributes their sparse inputs (see the module docstring).

    Args:
        model: the ``DistributedModelParallel`` (its top-level sharded modules are pipelined).
        device: the training device; on a GPU the copy and the input dist use two side streams.
        stale_after: ``None``: every lookup reads the tables after the previous step's update
            (exact). A step index ``n``: from batch ``n`` on, batch k+1 is looked up before batch
            k's embedding update and the embedding work runs on the side stream, overlapping the
            dense work (see the module docstring).
    """

    depth = 2
    """Batches fetched and copied ahead of the one being trained on."""

    def __init__(
        self, model: nn.Module, device: torch.device, *, stale_after: int | None = None
    ) -> None:
        self.device = device
        self.stale_after = stale_after
        gpu = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device, priority=-1) if gpu else None
        self.background = gpu
        """Load in a background thread (GPUs: the training thread only launches work; on CPU
        ranks the loader would compete with the step for the same cores)."""
        self._dist_stream = torch.cuda.Stream(device, priority=-1) if gpu else None
        self._modules = dict(top_level_sharded_modules(model))
        self._original: dict[str, Any] = {}
        self._paths: dict[str, tuple[Any, ...]] = {}  # learned from the first step
        self._queue: deque[_Staged] = deque()
        self._current: _Staged | None = None
        self._ready: dict[str, _Dist] = {}
        self.overlapped_lookups = 0
        """Sharded-module calls served with an input distributed ahead (tests and reports)."""
        self.started_ahead = 0
        """Batches whose input dist started during the previous batch's step (the overlap)."""
        self.looked_up_ahead = 0
        """Sharded-module calls served with a lookup made during the previous step (stale_after)."""
        self._step = -1  # index of the step being trained, in the run (see start_at)
        self._deferred: list[_Dist] = []  # this step's lookups whose backward runs after it
        self._attach()

    # -- set-up ----------------------------------------------------------------------------------
    @property
    def pipelined(self) -> dict[str, bool]:
        """Per sharded module: whether its input dist overlaps compute (known after step 1)."""
        return {name: bool(self._paths.get(name)) for name in self._modules}

    def _attach(self) -> None:
        from torchrec.distributed.types import ShardedModule

        for name, module in self._modules.items():
            if type(module).preprocess_input is not ShardedModule.preprocess_input:
                self._paths[name] = _NOT_FOUND  # transforms its input first: keep it synchronous
                log.info("input pipeline: %s preprocesses its input; not pipelined", name)
                continue
            self._original[name] = module.forward
            module.forward = self._forward_of(name, module)  # instance attribute, as TorchRec does

    def detach(self) -> None:
        """Give every sharded module its own forward back and drop batches in flight."""
        for name, forward in self._original.items():
            self._modules[name].forward = forward
        self._original.clear()
        self.reset()

    def reset(self) -> None:
        """Forget staged batches (a new epoch's iterator starts from an empty queue)."""
        self._queue.clear()
        self._current = None
        self._ready = {}

    # -- the data side ---------------------------------------------------------------------------
    def wrap(self, loader: Iterable) -> PipelinedLoader:
        """``loader`` whose batches are staged on the device as they are fetched."""
        return PipelinedLoader(loader, self)

    def stage(self, batch: Any) -> Any:
        """Copy ``batch`` to the device (side stream) and queue it for its training step."""
        return self.enqueue(self.prepare(batch))

    def prepare(self, batch: Any) -> _Staged:
        """Issue ``batch``'s copy to the device on the copy stream (safe from any thread)."""
        with _on(self._copy_stream):
            batch = _to_device(batch, self.device)
        staged = _Staged(batch)
        if self._copy_stream is not None:
            # waiters wait for THIS batch's copy, not for the later batches staged behind it
            staged.copied = torch.cuda.Event()
            staged.copied.record(self._copy_stream)
        return staged

    def enqueue(self, staged: _Staged) -> Any:
        """Queue a prepared batch for its training step (the training thread, in batch order)."""
        self._queue.append(staged)
        return staged.batch

    def next_batches(self, loader: Iterable) -> Iterator[_Staged]:
        """``loader``'s batches, prepared: by a background thread when :attr:`background` (the
        loader's own work, pinning and the copy's issue leave the training thread), else in
        line."""
        if not self.background:
            return (self.prepare(batch) for batch in loader)
        return _background(loader, self, self.depth)

    # -- the step side ---------------------------------------------------------------------------
    def before_step(self) -> None:
        """Batch k's dist completes; batch k+1's starts (call before the training step)."""
        self._current = self._queue.popleft() if self._queue else None
        self._ready = {}
        self._deferred = []
        if self._current is None:
            return
        self._step += 1
        cur = self._current
        if cur.dists and all(d.pooled is not None for d in cur.dists.values()):
            self._use_looked_up(cur)
        else:
            self._use_distributed(cur)
        self._ready = dict(cur.dists)
        if self._queue:
            self._start(self._queue[0], ahead=True)

    def _use_distributed(self, cur: _Staged) -> None:
        self._start(cur)  # no-op when started in the previous step
        self._finish(cur)
        with _on(self._dist_stream):  # the distributed ids, before batch k+1's dist is queued
            for d in cur.dists.values():
                d.data = d.tensors.wait()
        if self._dist_stream is not None:
            stream = torch.cuda.current_stream(self.device)
            distributed = torch.cuda.Event()
            distributed.record(self._dist_stream)
            stream.wait_event(cur.copied)  # the batch itself (dense features, labels)
            stream.wait_event(distributed)  # its ids, and nothing queued after them
            _record(cur.batch, stream)
            for d in cur.dists.values():
                d.data.record_stream(stream)
                d.ctx.record_stream(stream)

    def _use_looked_up(self, cur: _Staged) -> None:
        # the lookups' own events: the side stream may already hold the previous step's
        # embedding backward, which this step's dense work must not wait for
        if self._dist_stream is None:
            return
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(cur.copied)
        _record(cur.batch, stream)
        for d in cur.dists.values():
            stream.wait_event(d.looked_up)
            d.pooled.values().record_stream(stream)

    def before_backward(self) -> None:
        """Issue batch k+1's tensors all-to-all while batch k's backward runs (and, for a stale
        step, batch k+1's lookup: before batch k's embedding update is issued)."""
        if not self._queue:
            return
        nxt = self._queue[0]
        self._start(nxt, ahead=True)  # paths may have been learned in this step's forward
        self._finish(nxt)
        if self._stale_now():
            self._look_up_ahead(nxt)

    def after_backward(self) -> None:
        """Batch k's embedding backward and fused update, from the gradients its dense backward
        left on the pooled embeddings (side stream: overlaps the next step's dense work)."""
        deferred, self._deferred = self._deferred, []
        stream = self._dist_stream
        pairs = []
        for d in deferred:
            leaf = d.pooled.values()
            grad, leaf.grad = leaf.grad, None
            if grad is None:  # the loss did not use these embeddings
                continue
            # on a GPU a copy, on this stream: a dense part replayed from a CUDA graph leaves its
            # gradient in the graph's own buffer, which the next replay overwrites
            pairs.append((d.source, grad.clone() if stream is not None else grad))
        if not pairs:
            return
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            for _, grad in pairs:
                grad.record_stream(stream)
        with _on(stream), torch.enable_grad():
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])

    def start_at(self, step: int) -> None:
        """The next training step is the run's ``step`` (0-based; a resumed run's is its
        checkpoint's), so ``stale_after`` counts the run's steps, not this fit's."""
        self._step = step - 1

    def settle(self) -> None:
        """Make the current stream wait for the side stream's embedding work: call before
        anything reads the tables outside the training step (validation, a checkpoint)."""
        if self._dist_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._dist_stream)

    def after_step(self) -> None:
        """The training step returned: later forwards (validation) run unpipelined."""
        self._ready = {}
        self._current = None

    def _stale_now(self) -> bool:
        return self.stale_after is not None and self._step >= self.stale_after

    def _look_up_ahead(self, staged: _Staged) -> None:
        for name, d in staged.dists.items():
            if d.pooled is None:
                self._look_up(self._modules[name], d)
                self.looked_up_ahead += 1

    def _look_up(self, module: nn.Module, d: _Dist) -> None:
        """``d``'s lookup on the side stream; the forward gets its values as a detached leaf."""
        from torchrec.sparse.jagged_tensor import KeyedTensor

        with _on(self._dist_stream), torch.enable_grad():
            if d.data is None:
                d.data = d.tensors.wait()
            out = module.compute_and_output_dist(d.ctx, d.data)
            out = out.wait() if hasattr(out, "wait") else out
            if not isinstance(out, KeyedTensor):
                raise TypeError(
                    f"input pipeline: stale lookups need a module whose output is a KeyedTensor "
                    f"(an EmbeddingBagCollection); {type(module).__name__} returns "
                    f"{type(out).__name__}: use pipeline='sparse_dist' for this model"
                )
            leaf = out.values().detach().requires_grad_()
            d.source = out.values()
            d.pooled = KeyedTensor(
                keys=out.keys(),
                length_per_key=out.length_per_key(),
                values=leaf,
                key_dim=out.key_dim(),
            )
            if self._dist_stream is not None:
                d.looked_up = torch.cuda.Event()
                d.looked_up.record(self._dist_stream)

    def _start(self, staged: _Staged, *, ahead: bool = False) -> None:
        """Issue the splits all-to-all of every pipelined module's input (side stream)."""
        todo = [(n, p) for n, p in self._paths.items() if p and n not in staged.dists]
        if not todo:
            return
        if ahead and not staged.dists:
            self.started_ahead += 1
        with _on(self._dist_stream):
            if self._dist_stream is not None:
                self._dist_stream.wait_event(staged.copied)
                _record(staged.batch, self._dist_stream)
            for name, path in todo:
                module = self._modules[name]
                features = follow(staged.batch, path)
                ctx = module.create_context()
                staged.dists[name] = _Dist(features, ctx, splits=module.input_dist(ctx, features))

    def _finish(self, staged: _Staged) -> None:
        """Issue the tensors all-to-all of every started dist (side stream)."""
        with _on(self._dist_stream):
            for d in staged.dists.values():
                if d.tensors is None:
                    d.tensors = d.splits.wait()

    def _forward_of(self, name: str, module: nn.Module) -> Any:
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            features = args[0] if len(args) == 1 and not kwargs else None
            d = self._ready.pop(name, None)
            if d is not None and features is not None and _same_kjt(d.features, features):
                return self._compute(module, d)
            if d is not None:  # the step fed the module other ids than the batch's
                self._paths[name] = _NOT_FOUND
                log.warning(
                    "input pipeline: %s was not called with the batch's KeyedJaggedTensor "
                    "this step; its input dist runs synchronously from now on",
                    name,
                )
            elif name not in self._paths and self._current is not None:
                self._learn(name, features, self._current.batch)
            if self.stale_after is not None:
                self.settle()  # this forward reads the tables on the current stream
            return original(*args, **kwargs)

        return forward

    def _learn(self, name: str, features: Any, batch: Any) -> None:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        path = find_kjt(batch, features) if isinstance(features, KeyedJaggedTensor) else None
        self._paths[name] = path or _NOT_FOUND
        if path:
            log.info("input pipeline: %s reads batch%s", name, "".join(f"[{p!r}]" for p in path))
        else:
            log.warning(
                "input pipeline: the input of %s is not a KeyedJaggedTensor of the batch (the "
                "training step builds or transforms it); its input dist stays synchronous. Pass "
                "the batch's KeyedJaggedTensor to the sharded module unchanged to overlap it.",
                name,
            )

    def _compute(self, module: nn.Module, d: _Dist) -> Any:
        self.overlapped_lookups += 1
        if self.stale_after is None:
            return module.compute_and_output_dist(d.ctx, d.data)  # streams synced in before_step
        if d.pooled is None:  # not looked up ahead (a synchronous step): look it up now
            self._look_up(module, d)
            if self._dist_stream is not None:
                torch.cuda.current_stream(self.device).wait_event(d.looked_up)
                d.pooled.values().record_stream(torch.cuda.current_stream(self.device))
        self._deferred.append(d)
        return d.pooled


@dataclasses.dataclass
class _Failed:
    error: BaseException


_END = object()


def _host_batches(loader: Iterable, device: torch.device) -> tuple[Iterator[Any], bool]:
    """``(iterator over loader, pin here)``. A ``DataLoader(num_workers=0, pin_memory=True)``
    pins each batch in the thread that fetches it, after the dataset built it: the two copies
    then run in series. Its iterator is made without pinning and the second return says to pin
    in the copy thread instead, so building batch k+1 overlaps pinning batch k. A loader with
    workers already pins in its own thread and is left as it is."""
    from torch.utils.data import DataLoader

    if not (
        isinstance(loader, DataLoader)
        and device.type == "cuda"
        and loader.num_workers == 0
        and loader.pin_memory
    ):
        return iter(loader), False
    loader.pin_memory = False  # read once, when the iterator is made
    try:
        return iter(loader), True
    finally:
        loader.pin_memory = True


def _pinned(batch: Any, device: torch.device) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch, device.type)


class _Stage:
    """One thread of the background chain: ``work(item)`` for each item of ``source``, into a
    queue at most ``depth`` long; an error travels down the chain as a :class:`_Failed`."""

    def __init__(self, name: str, source: Iterator[Any], work, depth: int, stop, setup) -> None:
        self.out: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = stop
        self._thread = threading.Thread(
            target=self._run, args=(source, work, setup), name=name, daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self.out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[Any], work, setup) -> None:
        try:
            with setup():
                for item in source:
                    if isinstance(item, _Failed):
                        self._put(item)
                        return
                    if not self._put(work(item)):
                        return
            self._put(_END)
        except BaseException as error:  # noqa: BLE001  (re-raised in the training thread)
            self._put(_Failed(error))

    def items(self) -> Iterator[Any]:
        """The queue's items up to the end marker (a failure is passed on as an item)."""
        while not self._stop.is_set():
            try:
                item = self.out.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is _END:
                return
            yield item
            if isinstance(item, _Failed):
                return


def _background(loader: Iterable, pipeline: InputPipeline, depth: int) -> Iterator[_Staged]:
    """``pipeline.prepare``d batches of ``loader``, made by two daemon threads at most ``depth``
    ahead: one runs the loader (the dataset's own work), the other pins where the loader would
    have (:func:`_host_batches`) and issues the copy to the device, so the two overlap. The
    loader runs on a stream of its own and the copy waits for just that batch's part of it, so
    the copy event the consumers wait for covers a batch the loader builds on the device and
    nothing the loader queued after it. A loader error is raised here, in the training thread;
    closing this generator stops both threads at their next batch."""
    stop = threading.Event()
    device = pipeline.device
    gpu = device.type == "cuda"
    load_stream = torch.cuda.Stream(device, priority=-1) if gpu else None

    def on(stream: torch.Stream | None):
        def enter() -> contextlib.AbstractContextManager:
            if gpu:
                torch.cuda.set_device(device)  # the current device is per thread
            return _on(stream)

        return enter

    def fetch() -> Iterator[Any]:
        iterator, pin = _host_batches(loader, device)
        for batch in iterator:
            loaded = None
            if load_stream is not None:
                loaded = torch.cuda.Event()
                loaded.record(load_stream)
            yield batch, pin, loaded

    def copy(item: tuple[Any, bool, Any]) -> _Staged:
        batch, pin, loaded = item
        if loaded is not None:
            pipeline._copy_stream.wait_event(loaded)
        return pipeline.prepare(_pinned(batch, device) if pin else batch)

    fetcher = _Stage("rocmtrain-fetch", fetch(), lambda item: item, 1, stop, on(load_stream))
    copier = _Stage(
        "rocmtrain-input", fetcher.items(), copy, depth, stop, on(pipeline._copy_stream)
    )
    try:
        while True:
            item = copier.out.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()


class InputStallReport:
    """Says once, in one line, when training waits for its input: after ``warmup`` steps, over
    windows of ``window`` steps, the time the training loop waited for its next batch against the
    time between batches. A loader that keeps up costs nothing here (the wait is a queue pop)."""

    warmup = 20
    window = 50
    threshold = 0.10
    """Report when the wait is more than this share of the step."""

    def __init__(self, num_workers: int | None) -> None:
        self.num_workers = num_workers
        self.steps = 0
        self.reported: str | None = None
        self._wait = 0.0
        self._start: float | None = None
        self._in_window = 0

    def waited(self, seconds: float) -> None:
        if self._start is not None:
            self._wait += seconds

    def step(self) -> None:
        """A batch was handed to the training loop."""
        self.steps += 1
        if self.steps < self.warmup:
            return
        now = time.perf_counter()
        if self._start is None:
            self._start, self._wait, self._in_window = now, 0.0, 0
            return
        self._in_window += 1
        if self._in_window < self.window:
            return
        self.check(self._wait / self._in_window, (now - self._start) / self._in_window)
        self._start, self._wait, self._in_window = now, 0.0, 0

    def check(self, wait_s: float, step_s: float) -> None:
        """Report (once) if waiting ``wait_s`` per ``step_s`` step means the loader is slow."""
        if self.reported is not None or step_s <= 0 or wait_s / step_s <= self.threshold:
            return
        if self.num_workers:
            fix = (
                f"give the loader more worker processes (now {self.num_workers}; rocmtrain "
                "recipes: data.num_workers=N, your own DataLoader: num_workers=N) or, for "
                "synthetic data, generate on the GPU (data.generate_on=device)"
            )
        else:
            fix = (
                "build batches in loader processes (rocmtrain recipes: data.num_workers=N, your "
                "own DataLoader: num_workers=N) or, for synthetic data, on the GPU "
                "(data.generate_on=device); data=criteo_multihot reads with threads: raise "
                "data.read_threads"
            )
        self.reported = (
            f"input pipeline: training waited {wait_s * 1e3:.1f} ms per step for its next batch "
            f"({wait_s / step_s:.0%} of a {step_s * 1e3:.1f} ms step): the data loader is the "
            f"bottleneck; {fix}"
        )
        log.warning(self.reported)


class PipelinedLoader:
    """A training dataloader whose batches the :class:`InputPipeline` stages ``depth`` ahead.

    Lightning fetches a batch only when its step starts (it prefetches nothing from a loader with a
    length), so the loader itself runs ahead: when batch k is handed out, batches k+1 .. k+depth
    are already fetched and their host-to-device copies issued, and during step k the input dist
    of k+1 runs (TorchRec's schedule: the copy of i+2, the input dist of i+1). On a GPU a
    background thread pulls from the wrapped loader, so what the loader costs on the host (a
    ``pin_memory=True`` copy, building batches without workers, a pageable copy) overlaps
    training instead of adding to each step. The wait for each batch is measured and reported
    once when the loader is the bottleneck (:class:`InputStallReport`). Everything else (``len``,
    ``sampler``, ``dataset``, ``state_dict`` ...) is the wrapped loader's.
    """

    def __init__(self, loader: Iterable, pipeline: InputPipeline, depth: int | None = None) -> None:
        self.loader = loader
        self.pipeline = pipeline
        self.depth = depth if depth is not None else pipeline.depth
        self.stalls = InputStallReport(getattr(loader, "num_workers", None))

    def __iter__(self) -> Iterator[Any]:
        self.pipeline.reset()
        batches = self.pipeline.next_batches(self.loader)
        # in line, the wait is the loader's own work on the training thread: nothing to overlap
        stalls = self.stalls if self.pipeline.background else None
        ahead: deque[Any] = deque()
        try:
            while True:
                started = time.perf_counter()
                staged = next(batches, None)
                if stalls is not None:
                    stalls.waited(time.perf_counter() - started)
                if staged is None:
                    break
                ahead.append(self.pipeline.enqueue(staged))
                if len(ahead) > self.depth:
                    if stalls is not None:
                        stalls.step()
                    yield ahead.popleft()
            while ahead:
                yield ahead.popleft()
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # stops the background thread of an epoch left early

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "pipeline"):
            raise AttributeError(name)
        return getattr(self.loader, name)

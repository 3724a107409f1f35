"""TorchRec train pipelines as ``TorchRecStrategy.make_train_pipeline`` builds them.

``TrainPipelineSemiSync`` (torchrec 1.8) cannot start on CPU: its embedding lookup and forward
ask ``torch.get_device_module(device).current_stream()`` for the stream to wait on and call
``record_stream`` with it, which on CPU is a ``torch.cpu.Stream`` that ``Tensor.record_stream``
rejects ("unknown parameter type"); and its ``EmbeddingPipelinedForward`` takes the device
``cuda`` when it has no stream (``AssertionError: Torch not compiled with CUDA enabled``). CPU
ops run in order on the calling thread, so there is no stream to wait on or record:
:class:`CpuTrainPipelineSemiSync` passes none (as ``TrainPipelineSparseDist`` does on CPU) and is
otherwise TorchRec's class with its schedule (the lookup of batch i+1 before batch i's backward).
GPUs get the stock class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.profiler import record_function
from torchrec.distributed.train_pipeline.runtime_forwards import EmbeddingPipelinedForward
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync
from torchrec.distributed.train_pipeline.utils import _start_embedding_lookup, _wait_for_events
from torchrec.sparse.jagged_tensor import KeyedTensor


class _CpuEmbeddingPipelinedForward(EmbeddingPipelinedForward):
    """TorchRec's semi-sync forward of a sharded EBC with no stream to record on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._stream is None:
            self._device = torch.device("cpu")

    def detach_embeddings(self, embeddings: Any, cur_stream: Any) -> None:
        if not isinstance(embeddings, KeyedTensor):  # the JaggedTensor branch records nothing
            super().detach_embeddings(embeddings=embeddings, cur_stream=cur_stream)
            return
        # TorchRec's KeyedTensor branch without ``record_stream``: the lookup output feeds the
        # forward through a detached leaf; embedding_backward sends its gradient back later
        tensor = embeddings.values()
        detached = tensor.detach().requires_grad_()
        detached.retain_grad()
        embeddings._values = detached
        self._context.embedding_tensors.append([tensor])
        self._context.embedding_features.append([list(embeddings.keys())])
        self._context.detached_embedding_tensors.append([detached])


class CpuTrainPipelineSemiSync(TrainPipelineSemiSync):
    """``TrainPipelineSemiSync`` without device streams, for CPU ranks (see the module doc)."""

    _pipelined_forward_type = _CpuEmbeddingPipelinedForward

    def _mlp_forward(self, batch: Any, context: Any) -> tuple[torch.Tensor, Any]:
        with record_function(f"## forward {context.index} ##"):
            _wait_for_events(batch, context, None)
            return self._model_fwd(batch)

    def start_embedding_lookup(self, batch: Any, context: Any) -> None:
        if batch is None:
            return
        with record_function(f"## start_embedding_lookup {context.index} ##"):
            _wait_for_events(batch, context, None)
            for module in self._pipelined_modules:
                _start_embedding_lookup(
                    module,
                    context,
                    source_stream=None,
                    target_stream=None,
                    stream_context=self._stream_context,
                )


def semi_sync_pipeline(model: Any, optimizer: Any, device: torch.device, **kwargs: Any) -> Any:
    """TorchRec's ``TrainPipelineSemiSync`` on ``device`` (its stream-free form on CPU)."""
    cls = CpuTrainPipelineSemiSync if device.type == "cpu" else TrainPipelineSemiSync
    return cls(model, optimizer, device, **kwargs)


def train_pipeline(
    dmp: Any, optimizer: torch.optim.Optimizer, device: torch.device, *, kind: str, **kwargs: Any
) -> Any:
    """TorchRec's ``TrainPipelineSparseDist`` (``kind="sparse_dist"``) or the semi-sync pipeline
    (``kind="semi_sync"``, :func:`semi_sync_pipeline`) over the sharded model ``dmp``."""
    if kind == "semi_sync":
        return semi_sync_pipeline(dmp, optimizer, device, **kwargs)
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    return TrainPipelineSparseDist(dmp, optimizer, device, **kwargs)

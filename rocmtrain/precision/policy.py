"""Per-submodule precision: which part of a DLRM a parameter/module belongs to, and fp32 islands.

Groups (``GROUPS``), found from module/parameter names as TorchRec's DLRM names them
(``sparse_arch.embedding_bag_collection``, ``dense_arch``, ``inter_arch``, ``over_arch``) plus common
aliases (``bottom_mlp``, ``top_mlp``, ``crossnet``...)::

    >>> group_of("model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight")
    'embeddings'
    >>> group_of("model.over_arch.model.0.weight")
    'over_arch'

:func:`apply_submodule_policy` makes a module group run with autocast disabled (and its floating
inputs upcast to fp32) while the rest of the model runs under the Lightning plugin's autocast. It
uses forward pre-hooks plus ``always_call`` forward hooks, so an exception inside the submodule still
leaves autocast as it was; :func:`remove_submodule_policy` takes the hooks off again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

GROUPS = ("embeddings", "dense_arch", "interaction", "over_arch")

#: first match wins; matched against the dotted name, component-wise.
GROUP_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "embeddings",
        re.compile(
            r"(^|\.)(sparse_arch|embedding_bag_collection|ebc|embeddings?|emb_l|embedding_bags|tbe)(\.|$)"
        ),
    ),
    ("dense_arch", re.compile(r"(^|\.)(dense_arch|bottom_mlp|bot_l|bottom_arch)(\.|$)")),
    (
        "interaction",
        re.compile(r"(^|\.)(inter_arch|interaction|interaction_arch|crossnet|cross_net|dcn)(\.|$)"),
    ),
    ("over_arch", re.compile(r"(^|\.)(over_arch|top_mlp|top_l|top_arch|final_linear)(\.|$)")),
)

_OTHER = "other"


def group_of(name: str) -> str:
    """The group of a parameter or module name; ``"other"`` when no pattern matches."""
    for group, pattern in GROUP_PATTERNS:
        if pattern.search(name):
            return group
    return _OTHER


def group_modules(model: nn.Module) -> dict[str, list[tuple[str, nn.Module]]]:
    """Outermost module of each group: ``{group: [(name, module), ...]}`` (children skipped)."""
    found: dict[str, list[tuple[str, nn.Module]]] = {g: [] for g in GROUPS}
    claimed: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(p + ".") for p in claimed):
            continue
        group = group_of(name)
        if group != _OTHER:
            found[group].append((name, module))
            claimed.append(name)
    return found


def _to_fp32(x: object) -> object:
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float32:
        return x.float()
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_to_fp32(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_fp32(v) for k, v in x.items()}
    return x


def _device_types() -> Iterator[str]:
    yield "cpu"
    if torch.cuda.is_available():
        yield "cuda"


class _Fp32Island:
    """Hook pair: pre-hook disables autocast and upcasts inputs, post-hook restores autocast."""

    def __init__(self) -> None:
        self._stacks: list[ExitStack] = []

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        stack = ExitStack()
        for dev in _device_types():
            stack.enter_context(torch.autocast(dev, enabled=False))
        self._stacks.append(stack)
        return _to_fp32(args), _to_fp32(kwargs)  # type: ignore[return-value]

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        if self._stacks:
            self._stacks.pop().close()


def apply_submodule_policy(model: nn.Module, policy: dict[str, str]) -> dict[str, list[str]]:
    """Put every module group whose ``policy[group] == "fp32"`` into an fp32 island.

    Returns ``{group: [module names]}`` of the islands made (for the log). The handles are kept on
    the model (``_rocmtrain_precision_hooks``) for :func:`remove_submodule_policy`.
    """
    bad = {g: v for g, v in policy.items() if g not in GROUPS or v not in ("fp32", "autocast")}
    if bad:
        raise ValueError(
            f"precision.policy has invalid entries {bad}; groups: {GROUPS}, values: 'fp32', 'autocast'"
        )
    handles: list[RemovableHandle] = list(getattr(model, "_rocmtrain_precision_hooks", []))
    made: dict[str, list[str]] = {}
    for group, modules in group_modules(model).items():
        if policy.get(group) != "fp32":
            continue
        for name, module in modules:
            island = _Fp32Island()
            handles.append(module.register_forward_pre_hook(island.pre, with_kwargs=True))
            handles.append(
                module.register_forward_hook(island.post, with_kwargs=True, always_call=True)
            )
            made.setdefault(group, []).append(name)
    object.__setattr__(model, "_rocmtrain_precision_hooks", handles)
    return made


def remove_submodule_policy(model: nn.Module) -> None:
    """Remove the hooks :func:`apply_submodule_policy` added."""
    for handle in getattr(model, "_rocmtrain_precision_hooks", []):
        handle.remove()
    object.__setattr__(model, "_rocmtrain_precision_hooks", [])

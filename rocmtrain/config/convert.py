"""One place where plain values become typed configs: a dataclass, a mapping of its fields, a
Hydra ``DictConfig`` or the name of a preset in ``configs/<group>/``.

    as_config({"hang_timeout_seconds": 15}, WatchdogConfig, field="watchdog")
    as_config("mi300x_8gpu", RcclConfig, field="rccl", group="rccl")

An unknown key, a wrong type or a bad value raises :class:`rocmtrain.config.ConfigError` naming the
field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rocmtrain.config import ConfigError

T = TypeVar("T")


def _presets(group: str) -> list[str]:
    from rocmtrain.config.schema import configs_dir

    return sorted(p.stem for p in (configs_dir() / group).glob("*.yaml"))


def _load_preset(name: str, *, field: str, group: str) -> Any:
    from rocmtrain.config.schema import configs_dir

    path = configs_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            field, name, f"choose a preset of configs/{group}/: {', '.join(_presets(group))}"
        )
    node = OmegaConf.load(path)
    if "defaults" not in node:
        return node
    # A preset may build on another of its group through a Hydra defaults list; outside Hydra
    # that list would be read as a field, so compose it here the way Hydra does, in order.
    parts, own = [], OmegaConf.masked_copy(node, [k for k in node if k != "defaults"])
    for entry in node.defaults:
        if entry == "_self_":
            parts.append(own)
        elif isinstance(entry, str) and entry != name:
            parts.append(_load_preset(entry, field=field, group=group))
        else:
            raise ConfigError(
                field, name, f"configs/{group}/{name}.yaml: unsupported defaults entry {entry!r}"
            )
    if own not in parts:
        parts.append(own)
    return OmegaConf.merge(*parts)


def as_config(value: Any, cls: type[T], *, field: str, group: str | None = None) -> T:
    """``value`` as a validated ``cls`` instance (``None`` = the defaults)."""
    if value is None:
        value = {}
    if isinstance(value, cls):
        _validate(value)
        return value
    if isinstance(value, str):
        if group is None:
            raise ConfigError(field, value, f"pass a {cls.__name__} or a mapping of its fields")
        value = _load_preset(value, field=field, group=group)
    if not (isinstance(value, Mapping) or OmegaConf.is_config(value)):
        raise ConfigError(
            field,
            value,
            f"pass a {cls.__name__}, a mapping of its fields"
            + (f" or a preset name of configs/{group}/" if group else ""),
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), value)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        names = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else dict(value)
        raise ConfigError(field, shown, f"{exc.msg}; {cls.__name__} fields: {names}") from None
    assert isinstance(obj, cls), type(obj)
    _validate(obj)
    return obj


def _validate(obj: Any) -> None:
    # a config that validates itself in __post_init__ did so when it was built: once is enough
    if hasattr(type(obj), "__post_init__"):
        return
    check = getattr(obj, "validate", None)
    if callable(check):
        check()

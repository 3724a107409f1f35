"""``cfg`` goes down through the layers: a trace of the real CLI path, measured.

The CLI (``rocmtrain.cli.hydra_main``) runs in-process under ``sys.setprofile`` from
``rocmtrain.cli.run`` on. Every call into the package whose arguments hold the run config (the
composed ``DictConfig``, the ``RunConfig`` or one of its sub-configs) is recorded with the module
that made it. A call counts as a *return to a higher module* when its callee's module sits above
its caller's in the package's layering.

The layering is the package's own import graph, read from the source with ``ast`` (nothing
hand-listed): module A is above B when A imports B, directly or through other modules. Imports
at module level decide; an import inside a function decides too unless it closes a cycle, since
such a lazy import is how a lower module reaches back up, and counting it as "A imports B" would
hide the very call this test is after. ``if TYPE_CHECKING`` imports are not imports.

Besides the upward calls, the trace counts how often the GPU question is asked
(``rocmtrain.platform.is_gpu_run``: the run's :class:`~rocmtrain.platform.Placement` answers it
once and is passed on) and how often the run config is validated (``validate_run_config`` once; no
config object runs the same ``validate*`` check twice).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rocmtrain"

#: upward calls the layering tolerates along one run's trace
MAX_UPWARD = 5


# -- the layering, from the import graph ---------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import of ``tree`` and whether it runs at module level (TYPE_CHECKING blocks skipped)."""

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, top
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from visit(child, top and not nested)

    return visit(tree, True)


@dataclasses.dataclass
class ImportGraph:
    """Which package module imports which (``top``: at module level; ``lazy``: in a function)."""

    top: dict[str, set[str]]
    lazy: dict[str, set[str]]

    @classmethod
    def of_package(cls) -> ImportGraph:
        paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
        trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in paths.items()}
        reexports = {m: _reexports(m, t, paths) for m, t in trees.items() if _is_package(paths[m])}
        graph = cls({m: set() for m in paths}, {m: set() for m in paths})
        for m, tree in trees.items():
            for node, top in _imports(tree):
                for target in _targets(m, node, paths, reexports):
                    if target != m:
                        (graph.top if top else graph.lazy)[m].add(target)
        return graph

    def layering(self) -> Callable[[str, str], bool]:
        """``above(a, b)``: module ``a`` imports ``b``, directly or transitively, through
        module-level imports and the lazy imports that do not close a cycle."""
        edges = {m: set(t) for m, t in self.top.items()}
        for m in sorted(self.lazy):
            for t in sorted(self.lazy[m] - edges[m]):
                if m not in _reach(edges, t):  # t does not already reach m: no cycle
                    edges[m].add(t)
        reach = {m: _reach(edges, m) for m in edges}

        def above(a: str, b: str) -> bool:
            return b in reach.get(a, ()) and a not in reach.get(b, ())

        return above


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom, paths: dict[str, Path]) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(paths[module]) else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _reexports(module: str, tree: ast.AST, paths: dict[str, Path]) -> dict[str, str]:
    """A package's ``from x import Name`` at module level: Name -> x (where it is defined)."""
    out = {}
    for node, top in _imports(tree):
        if top and isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = _absolute(module, node, paths)
    return out


def _targets(
    module: str, node: ast.Import | ast.ImportFrom, paths: dict[str, Path], reexports: dict
) -> set[str]:
    """The package modules an import statement reads from; a name a package re-exports is read
    from the module that defines it (``from rocmtrain.data import X`` depends on X's module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in paths}
    source = _absolute(module, node, paths)
    if source not in paths:
        return set()
    return {_defining_module(source, a.name, paths, reexports) for a in node.names}


def _defining_module(source: str, name: str, paths: dict[str, Path], reexports: dict) -> str:
    seen = set()
    while source not in seen:
        seen.add(source)
        if f"{source}.{name}" in paths:  # a submodule
            return f"{source}.{name}"
        origin = reexports.get(source, {}).get(name)
        if origin not in paths:
            return source
        source = origin
    return source


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in edges.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    seen.discard(start)
    return seen


@cache
def above() -> Callable[[str, str], bool]:
    return ImportGraph.of_package().layering()


# -- the trace -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Call:
    caller: str  #: module.function
    callee: str
    carries_cfg: bool

    @property
    def caller_module(self) -> str:
        return self.caller.rsplit(".", 1)[0]

    @property
    def callee_module(self) -> str:
        return self.callee.rsplit(".", 1)[0]

    def upward(self, is_above: Callable[[str, str], bool]) -> bool:
        a, b = self.callee_module, self.caller_module
        return self.carries_cfg and a != b and is_above(a, b)


@dataclasses.dataclass
class Trace:
    calls: list[Call] = dataclasses.field(default_factory=list)
    gpu_questions: list[str] = dataclasses.field(default_factory=list)  #: callers of is_gpu_run
    run_validations: list[str] = dataclasses.field(default_factory=list)
    checks: Counter = dataclasses.field(default_factory=Counter)  #: (config, check) -> calls

    def upward(self) -> list[Call]:
        return [c for c in self.calls if c.upward(above())]

    def report(self) -> str:
        is_above = above()
        lines = ["cfg-carrying calls between package modules (^ = a return to a higher module):"]
        for c in self.calls:
            if c.carries_cfg and c.caller_module != c.callee_module:
                mark = "^" if c.upward(is_above) else " "
                lines.append(f"  {mark} {c.caller} -> {c.callee}")
        lines.append(f"GPU question asked by: {self.gpu_questions}")
        lines.append(f"run config validated by: {self.run_validations}")
        twice = {f"{k[0]}.{k[1]}": n for k, n in self.checks.items() if n > 1}
        lines.append(f"config checks run more than once: {twice}")
        return "\n".join(lines)


def _config_types() -> set[type]:
    from rocmtrain.config.schema import RunConfig

    found: set[type] = set()

    def walk(obj: Any) -> None:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and type(obj) not in found:
            found.add(type(obj))
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name))

    walk(RunConfig())
    return found


def _profiler(trace: Trace) -> Callable[..., None]:
    from omegaconf import DictConfig, OmegaConf

    from rocmtrain import platform
    from rocmtrain.config import schema

    types = _config_types()
    root = str(PACKAGE) + os.sep
    gpu_code, validate_code = platform.is_gpu_run.__code__, schema.validate_run_config.__code__

    def is_cfg(v: Any) -> bool:
        if isinstance(v, DictConfig):
            return OmegaConf.get_type(v) in types
        return type(v) in types

    def args(frame: Any) -> list[Any]:
        code, local = frame.f_code, frame.f_locals
        n = code.co_argcount + code.co_kwonlyargcount
        values = [local.get(name) for name in code.co_varnames[:n]]
        if code.co_flags & 0x04:  # *args
            values += list(local.get(code.co_varnames[n]) or ())
            n += 1
        if code.co_flags & 0x08:  # **kwargs
            values += list((local.get(code.co_varnames[n]) or {}).values())
        return values

    def where(frame: Any) -> str:
        return f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}"

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        code, values = frame.f_code, args(frame)
        if code is gpu_code:
            trace.gpu_questions.append(where(frame.f_back))
        if code is validate_code:
            trace.run_validations.append(where(frame.f_back))
        if code.co_name.startswith("validate") and values and type(values[0]) in types:
            trace.checks[(type(values[0]).__name__, code.co_name, id(values[0]))] += 1
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.startswith(root):
            trace.calls.append(Call(where(caller), where(frame), any(map(is_cfg, values))))

    return profile


def trace_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, Trace]:
    """Run ``python -m rocmtrain *argv`` in-process; trace everything below ``cli.run``."""
    import rocmtrain.cli as cli

    trace, real_run = Trace(), cli.run
    profile = _profiler(trace)

    def traced_run(cfg: Any) -> int:
        sys.setprofile(profile)
        try:
            return real_run(cfg)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(cli, "run", traced_run)
    return cli.hydra_main(argv), trace


# -- the measurement -----------------------------------------------------------------------------
RUNS = {
    "dry_run_cpu": ["dry_run=true"],
    "dry_run_gpu_recipe": ["recipe=dlrm_mi300", "dry_run=true"],
    # the real run's wiring up to the fit (one CPU rank; Trainer.fit itself is stubbed): data,
    # module with an autocast embedding output (which asks whether the run is on a GPU), trainer
    "train_until_fit": [
        "trainer.devices=1",
        "precision=bf16",
        "model.embedding_output_dtype=autocast",
    ],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_cfg_goes_down_the_layers(name: str, tmp_path: Path, monkeypatch) -> None:
    import pytorch_lightning as pl

    fits: list[Any] = []
    monkeypatch.setattr(pl.Trainer, "fit", lambda self, *a, **k: fits.append(self))
    monkeypatch.chdir(tmp_path)
    code, trace = trace_cli([*RUNS[name], f"run_dir={tmp_path / 'run'}"], monkeypatch)
    report = trace.report()
    assert code == 0, report
    assert fits or "dry_run=true" in RUNS[name], report
    assert len(trace.upward()) <= MAX_UPWARD, report
    assert len(trace.gpu_questions) == 1, report
    assert len(trace.run_validations) == 1, report
    assert max(trace.checks.values(), default=0) <= 1, report


def test_layering_is_the_import_graph() -> None:
    """The layering the trace uses puts the CLI above training, training above the strategy, the
    strategy above the configs and the platform; no lower module is above a higher one."""
    is_above = above()
    chains = [
        ["rocmtrain.cli", "rocmtrain.train", "rocmtrain.strategies.torchrec"],
        ["rocmtrain.strategies.torchrec", "rocmtrain.config.strategy", "rocmtrain.config.rccl"],
        ["rocmtrain.train", "rocmtrain.config.schema", "rocmtrain.config.model"],
    ]
    for chain in chains:
        for hi, lo in itertools.pairwise(chain):
            assert is_above(hi, lo) and not is_above(lo, hi), (hi, lo)
    assert is_above("rocmtrain.train", "rocmtrain.platform")
    assert is_above("rocmtrain.dry_run", "rocmtrain.strategies.torchrec")


def test_a_call_up_the_layers_counts() -> None:
    """The counter itself: a config module calling into ``train`` with the config is upward;
    the same call without the config, or a call down, is not."""
    is_above = above()
    up = Call("rocmtrain.config.schema.f", "rocmtrain.train.g", carries_cfg=True)
    down = Call("rocmtrain.train.g", "rocmtrain.config.schema.f", carries_cfg=True)
    assert up.upward(is_above)
    assert not dataclasses.replace(up, carries_cfg=False).upward(is_above)
    assert not down.upward(is_above)


def test_a_lazy_import_back_up_does_not_reorder_the_layers() -> None:
    """A lower module that imports a higher one inside a function does not become its peer."""
    graph = ImportGraph(
        top={"pkg.hi": {"pkg.lo"}, "pkg.lo": set()},
        lazy={"pkg.hi": set(), "pkg.lo": {"pkg.hi"}},
    )
    is_above = graph.layering()
    assert is_above("pkg.hi", "pkg.lo") and not is_above("pkg.lo", "pkg.hi")

"""The package's layers and import graph, read from the source with :mod:`ast` (test support).

``docs/design.md`` ("Layers") states the rules these serve: every package sits in one layer and
imports only from its own layer or below; there is no import circle; and what a training process
imports (the training-process modules below and everything they import) needs nothing but the
standard library and the core dependencies. Module-level, function-level and type-only imports
(under ``if TYPE_CHECKING:``) all count for the layers and circles: a type-only import is an
arrow for a reader too. Only executed imports count for what a process needs at run time.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

REPO = Path(__file__).resolve().parents[1]

# A module longer than this is worth a look: is it one responsibility? (docs/design.md, "Layers").
# The suite warns; a module is split along a seam of responsibility, never to fit a count.
REVIEW_MODULE_LINES = 500
# A folder with more modules directly in it than this says a concept is missing a subpackage.
MAX_FOLDER_MODULES = 15

# Where each installed package's source lives in the repository.
ROOTS = {"perseus": REPO / "perseus", "perseus.adapters": REPO / "adapters"}

# Bottom to top. A module belongs to the longest matching prefix.
LAYERS: List[Tuple[str, List[str]]] = [
    # Plain records and the bounds every layer checks: standard library only.
    (
        "records",
        [
            "perseus.records",
            "perseus.lazy_names",
            "perseus.config.numbers",
            "perseus.config.bounds",
            "perseus.config.checked",
        ],
    ),
    (
        "foundation",
        [
            "perseus.errors",
            "perseus.config",  # the package (lazy re-exports); numbers and bounds sit lower
            "perseus.config.schema",
            "perseus.config.enums",
            "perseus.config.validation",
            "perseus.schedule",
            "perseus.pipeline_order",
            "perseus.process_exit",
            "perseus.wire",  # the package and its modules (vocabulary, fields, bounds, jobs, ...)
            "perseus.formats",
            # A job's live snapshot, its Prometheus rendering and its textfile (the optimizers'
            # snapshots sit with the optimizers, below).
            "perseus.observability",
            "perseus.observability.snapshot",
            "perseus.observability.prometheus",
            "perseus.observability.textfile",
            "perseus.observability.counter",
        ],
    ),
    ("gpu", ["perseus.gpu"]),
    # The package root re-exports PerseusOptimizer (lazily): it sits with the runtime.
    ("runtime", ["perseus.runtime", "perseus"]),
    (
        "profiler/planner",
        [
            "perseus.profiler",
            "perseus.planner",
            "perseus.power_limit",
            "perseus.batch_size",
            "perseus.models",
            "perseus.adapters",  # outside the stack: imports runtime and below only
            "perseus.observability.optimizers",
        ],
    ),
    ("server", ["perseus.server", "perseus.train"]),
    ("launcher", ["perseus.launcher"]),
    ("apps", ["perseus.apps"]),
]

# The modules a training process imports (a user's script with an adapter, a perseus-train
# rank's runtime); they and all they import must run with only the core dependencies.
TRAINING_PROCESS = [
    *dict(LAYERS)["records"],
    *dict(LAYERS)["foundation"],
    *dict(LAYERS)["gpu"],
    *dict(LAYERS)["runtime"],
    "perseus.adapters",
]
# Import names of the core dependencies (pyproject's ``dependencies``) and what they bring.
CORE_IMPORTS = {"omegaconf", "yaml", "antlr4", "pynvml"}
# Optional packages a training-process module may import inside a function, on the path that
# needs them only, each installed by the pip extra named here (its absence is one message
# naming that extra): the metrics textfile, the experiment trackers.
OPTIONAL_EXTRAS = {
    "prometheus_client": "metrics",
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
}
# The frameworks the adapters patch: the user's process already has them.
PATCHED_FRAMEWORKS = {"torch", "deepspeed", "megatron", "Merak"}

# A Merak rank: ``perseus.train.worker`` running ``perseus.train.merak.job`` in Merak's Python 3.9
# environment (scripts/merak-env), where Perseus is installed without its dependencies beside
# scripts/merak-requirements.txt. It imports these and what they import.
MERAK_RANK = ["perseus.train.worker", "perseus.train.merak.job"]
# Import name -> the distribution scripts/merak-requirements.txt must list for it (Merak itself is
# the clone on the environment's path).
MERAK_RANK_IMPORTS = {
    "omegaconf": "omegaconf",
    "yaml": "omegaconf",  # omegaconf's own dependencies
    "antlr4": "omegaconf",
    "pynvml": "nvidia-ml-py",
    "torch": "torch",
    "numpy": "numpy",
    "tqdm": "tqdm",
}
MERAK_REQUIREMENTS = REPO / "scripts" / "merak-requirements.txt"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as found in ``source`` at ``line``."""

    source: str
    target: str
    line: int
    in_function: bool
    type_only: bool = False


def module_files() -> Dict[str, Path]:
    """Every module of the installed packages, by dotted name."""
    out: Dict[str, Path] = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def layer_named(name: str) -> int:
    """Index of the layer called ``name`` in :data:`LAYERS`."""
    return [n for n, _ in LAYERS].index(name)


def layer_of(module: str) -> Optional[int]:
    """Index of ``module``'s layer in :data:`LAYERS` (longest prefix), or None."""
    best: Tuple[int, int] = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), index)
    return None if best[1] < 0 else best[1]


def parse(path: Path) -> ast.Module:
    """The syntax tree of one source file, parsed once per process while the file is unchanged
    (the checks parse the package several times over; callers only read the tree)."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports_of(module: str, path: Path) -> Iterator[Import]:
    """Every import of one module (relative imports resolved), type-only ones marked."""
    tree = parse(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    yield from _walk(tree, module, package, in_function=False, type_only=False)


def _walk(
    node: ast.AST, module: str, package: str, in_function: bool, type_only: bool
) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield from _walk_one(sub, module, package, in_function, True)
            for sub in child.orelse:
                yield from _walk_one(sub, module, package, in_function, type_only)
            continue
        yield from _walk_one(child, module, package, in_function, type_only)


def _walk_one(
    child: ast.AST, module: str, package: str, in_function: bool, type_only: bool
) -> Iterator[Import]:
    nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
    if isinstance(child, ast.Import):
        for alias in child.names:
            yield Import(
                source=module,
                target=alias.name,
                line=child.lineno,
                in_function=in_function,
                type_only=type_only,
            )
    elif isinstance(child, ast.ImportFrom):
        base = _resolve(child, package)
        for alias in child.names:
            # ``from pkg import mod`` imports pkg.mod when that is a module.
            yield Import(
                source=module,
                target=f"{base}.{alias.name}",
                line=child.lineno,
                in_function=in_function,
                type_only=type_only,
            )
    yield from _walk(child, module, package, nested, type_only)


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def graph() -> Dict[str, List[Import]]:
    """``module -> its imports``, the internal targets mapped to the module they name."""
    modules = module_files()
    out: Dict[str, List[Import]] = {}
    for module, path in modules.items():
        edges = []
        for imp in imports_of(module, path):
            target = _internal(imp.target, modules)
            edges.append(
                Import(
                    source=imp.source,
                    target=target or imp.target,
                    line=imp.line,
                    in_function=imp.in_function,
                    type_only=imp.type_only,
                )
            )
        out[module] = edges
    return out


def package_edges(graph: Dict[str, List[Import]]) -> Dict[str, Set[str]]:
    """``module -> the repository modules importing it runs first``, executed imports only.

    Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` before ``c``; a module's own
    packages are already running when it starts, so only the target's other packages count.
    This is how a package ``__init__`` that imports its siblings closes a circle that no single
    import statement shows (``x -> p.y`` where ``p/__init__`` imports ``p.z`` and ``p.z``
    imports ``x``).
    """
    out: Dict[str, Set[str]] = {}
    for module, imports in graph.items():
        own = set(parent_packages(module))
        targets: Set[str] = set()
        for imp in imports:
            if imp.target not in graph or imp.type_only or imp.target == module:
                continue
            targets.add(imp.target)
            targets.update(p for p in parent_packages(imp.target) if p in graph and p not in own)
        out[module] = targets - {module}
    return out


def _internal(target: str, modules: Dict[str, Path]) -> Optional[str]:
    """The repository module ``target`` names (``a.b.name`` -> ``a.b``), or None."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def is_internal(target: str) -> bool:
    """Whether ``target`` is one of this repository's modules."""
    return target.split(".")[0] == "perseus"


def third_party(target: str) -> Optional[str]:
    """The top-level name of a non-standard-library import, or None."""
    top = target.split(".")[0]
    if is_internal(target) or top in sys.stdlib_module_names or top == "__future__":
        return None
    return top


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def training_process_modules() -> List[str]:
    """The training-process modules as found on disk (new ones are covered too).

    A module under one of those prefixes whose own layer is higher (e.g. the optimizers'
    snapshots in ``perseus.observability.optimizers``) is not one of them; the adapters are.
    """
    prefixes = [p for p in TRAINING_PROCESS if p != "perseus"]
    runtime = layer_named("runtime")
    return [
        m
        for m in module_files()
        if m == "perseus"
        or (
            any(m == p or m.startswith(p + ".") for p in prefixes)
            and (m.startswith("perseus.adapters") or (layer_of(m) or 0) <= runtime)
        )
    ]


def closure(roots: List[str], edges: Dict[str, List[Import]]) -> Set[str]:
    """The repository modules ``roots`` import when they run, directly or not (``roots``
    included); type-only imports are never executed and do not count. Importing a module runs
    its packages' ``__init__`` first, so those count too."""
    seen: Set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(
            i.target for i in edges.get(module, []) if i.target in edges and not i.type_only
        )
        todo.extend(p for p in parent_packages(module) if p in edges)
    return seen


def parent_packages(module: str) -> List[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages whose ``__init__`` runs before ``module``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def modules_per_folder() -> Dict[Path, int]:
    """How many modules (``__init__.py`` included) sit directly in each package folder."""
    counts: Dict[Path, int] = {}
    for path in module_files().values():
        counts[path.parent] = counts.get(path.parent, 0) + 1
    return counts


# A record with this many fields or more is built with keywords (docs/design.md, "Layers").
WIDE_RECORD_FIELDS = 5
# More positional arguments than this to a wide record's constructor is a positional build.
MAX_POSITIONAL_ARGS = 3


def record_field_counts() -> Dict[str, int]:
    """``class name -> number of fields`` of every dataclass and NamedTuple of the packages."""
    counts: Dict[str, int] = {}
    for path in module_files().values():
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ClassDef) and _is_record(node):
                fields = [
                    s
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)
                ]
                counts[node.name] = max(counts.get(node.name, 0), len(fields))
    return counts


def _is_record(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return any(getattr(base, "id", "") == "NamedTuple" for base in node.bases)


def positional_wide_records(paths: List[Path]) -> List[str]:
    """Calls in ``paths`` that build a wide record with more than a few positional arguments
    (a ``*args`` unpacking, which deserialisation uses, is left alone)."""
    wide = {n for n, c in record_field_counts().items() if c >= WIDE_RECORD_FIELDS}
    found = []
    for path in paths:
        for node in ast.walk(parse(path)):
            if not isinstance(node, ast.Call) or len(node.args) <= MAX_POSITIONAL_ARGS:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in wide and not any(isinstance(a, ast.Starred) for a in node.args):
                shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                found.append(f"{shown}:{node.lineno}: {name}(...)")
    return found

"""The layer rules of docs/design.md, checked on the source: no circle, no upward import, and a
training process that needs only the core dependencies."""

from __future__ import annotations

import warnings
from typing import Dict, List

import pytest

from tests import architecture as arch

# The checks read one import graph (and the trees :func:`arch.parse` keeps): one worker builds
# them once.
pytestmark = pytest.mark.one_worker
Graph = Dict[str, List[arch.Import]]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return arch.graph()


def _internal_edges(graph: Graph) -> dict:
    return {
        module: {i.target for i in imports if i.target in graph and i.target != module}
        for module, imports in graph.items()
    }


def test_every_module_has_a_layer() -> None:
    assert [m for m in arch.module_files() if arch.layer_of(m) is None] == []


def test_long_modules_are_named_for_review() -> None:
    """docs/design.md: a module is split when it holds two responsibilities, not at a size; a
    long one is named in the test report (a warning) so a reviewer looks at it."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in arch.module_files().items()}
    for module, lines in sorted(sizes.items()):
        if lines > arch.REVIEW_MODULE_LINES:
            warnings.warn(
                f"{module} has {lines} lines: does it hold more than one responsibility?",
                stacklevel=1,
            )


def test_no_folder_holds_more_modules_than_one_concept_needs() -> None:
    """A folder is a concept; more than a handful of modules side by side says a subpackage
    is missing (docs/design.md, "Layers")."""
    crowded = {
        str(folder.relative_to(arch.REPO)): count
        for folder, count in arch.modules_per_folder().items()
        if count > arch.MAX_FOLDER_MODULES
    }
    assert crowded == {}


def test_no_module_name_repeats_its_folder_as_a_prefix_family() -> None:
    """Three or more modules of one folder sharing a name prefix (``emulated_*``, ``job_*``) are
    a subpackage waiting to be made."""
    families: dict = {}
    for module in arch.module_files():
        folder, _, name = module.rpartition(".")
        if "_" in name and not name.startswith("_"):
            families.setdefault((folder, name.split("_")[0]), []).append(name)
    assert {k: v for k, v in families.items() if len(v) >= 3} == {}


def test_no_import_circle(graph: Graph) -> None:
    assert arch.cycles(_internal_edges(graph)) == []


def test_no_import_circle_through_a_package_init(graph: Graph) -> None:
    """Importing ``p.m`` runs ``p/__init__`` first: a circle through it fails at import time
    in whichever order the modules are first imported."""
    assert arch.cycles(arch.package_edges(graph)) == []


def test_package_edges_see_the_init_a_target_runs() -> None:
    imp = arch.Import
    graph = {
        "x": [imp("x", "p.y", 1, False)],
        "p": [imp("p", "p.z", 1, False)],
        "p.y": [],
        "p.z": [imp("p.z", "x", 1, False)],
    }
    edges = arch.package_edges(graph)
    assert edges["x"] == {"p.y", "p"}
    assert arch.cycles(edges) == [["p", "p.z", "x"]]


def test_cycle_finder_finds_a_circle() -> None:  # the check above can fail
    assert arch.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_upward_import(graph: Graph) -> None:
    upward = [
        f"{imp.source}:{imp.line} ({arch.LAYERS[arch.layer_of(imp.source) or 0][0]}) imports "
        f"{imp.target} ({arch.LAYERS[arch.layer_of(imp.target) or 0][0]})"
        for imports in graph.values()
        for imp in imports
        if imp.target in graph
        and (arch.layer_of(imp.target) or 0) > (arch.layer_of(imp.source) or 0)
    ]
    assert upward == []


def test_training_process_needs_only_core_dependencies(graph: Graph) -> None:
    reached = arch.closure(arch.training_process_modules(), graph)
    foreign = sorted(
        f"{imp.source}:{imp.line} imports {imp.target}"
        for module in reached
        for imp in graph[module]
        if not imp.type_only
        and (top := arch.third_party(imp.target)) is not None
        and top not in arch.CORE_IMPORTS
        and not (top in arch.PATCHED_FRAMEWORKS and module.startswith("perseus.adapters"))
        and not (top in arch.OPTIONAL_EXTRAS and imp.in_function)
    )
    assert foreign == []
    # The training path reaches none of the planner, server, launcher or apps.
    runtime = arch.layer_named("runtime")
    assert sorted(m for m in reached if (arch.layer_of(m) or 0) > runtime) == sorted(
        m for m in reached if m.startswith("perseus.adapters")
    )


def test_optional_extras_are_pyproject_extras() -> None:
    """Every optional package a training process may import lazily is installed by the extra
    its message names."""
    import tomllib

    extras = tomllib.loads((arch.REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for package, extra in arch.OPTIONAL_EXTRAS.items():
        wanted = package.replace("_", "-")
        assert any(r.replace("_", "-").startswith(wanted) for r in extras[extra]), (package, extra)


def test_merak_rank_needs_only_what_merak_env_installs(graph: Graph) -> None:
    reached = arch.closure(arch.MERAK_RANK, graph)
    foreign = sorted(
        f"{imp.source}:{imp.line} imports {imp.target}"
        for module in reached
        for imp in graph[module]
        if not imp.type_only
        and (top := arch.third_party(imp.target)) is not None
        and top not in arch.MERAK_RANK_IMPORTS
        and top != "Merak"
        and not (top in arch.OPTIONAL_EXTRAS and imp.in_function)
    )
    assert foreign == []
    listed = {
        line.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
        for line in arch.MERAK_REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert set(arch.MERAK_RANK_IMPORTS.values()) <= listed
    # A rank reaches the training process, the model zoo and the train package, nothing else.
    above_runtime = sorted(
        m
        for m in reached
        if (arch.layer_of(m) or 0) > arch.layer_named("runtime")
        and not m.startswith(("perseus.adapters", "perseus.models", "perseus.train"))
    )
    assert above_runtime == []


def test_configuration_validation_and_wire_import_in_one_direction(graph: Graph) -> None:
    """Validation imports the configuration, never the reverse; the wire knows no configuration
    (the runtime builds the job spec from it); the records import nothing of Perseus but the
    records layer."""
    config = {"perseus.config.schema", "perseus.config.validation"}
    wrong = sorted(
        f"{imp.source}:{imp.line} imports {imp.target}"
        for module, imports in graph.items()
        for imp in imports
        if (module == "perseus.config.schema" and imp.target == "perseus.config.validation")
        or (module.startswith("perseus.wire") and imp.target in config)
        or (
            arch.layer_of(module) == arch.layer_named("records")
            and arch.is_internal(imp.target)
            and arch.layer_of(imp.target) != arch.layer_named("records")
        )
    )
    assert wrong == []


def test_wide_records_are_built_with_keywords() -> None:
    """A record of five fields or more is built with its field names, in the package, its
    scripts and its tests alike."""
    paths = [
        p
        for root in ("perseus", "adapters", "scripts", "tests")
        for p in (arch.REPO / root).rglob("*.py")
    ]
    assert arch.positional_wide_records(paths) == []


def test_a_positional_wide_record_is_found(tmp_path) -> None:  # the check above can fail
    source = tmp_path / "m.py"
    source.write_text(
        "StepRecord(1, 0, 0.0, 1.0)\nStepRecord(step=1, stage=0, start_s=0.0, end_s=1.0)\n"
        "StepRecord(*row)\nEnergyUpdate(1.0, 2.0, 0.0)\n"
    )
    assert arch.positional_wide_records([source]) == [f"{source}:1: StepRecord(...)"]

"""Bad configuration values, as a user types them on the command line: each one refused.

Every case goes through Hydra's composition and :func:`perseus.config.validation.to_object` (what
the apps do) and must end in :class:`~perseus.errors.ConfigError` naming the key and the problem,
one line per problem. The NaN / infinity / out-of-range cases are generated from the range table
itself, so a key added to it is covered at once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from hydra import compose, initialize_config_module

from perseus.apps.common import register_configs
from perseus.config.checked import Bound
from perseus.config.numbers import Range
from perseus.config.schema import PerseusConfig
from perseus.config.validation import P2P_POWER_W, RANGES, to_object, validate
from perseus.errors import ConfigError
from perseus.wire import EnergySettings, JobSpec, ProfilerSettings


@pytest.fixture(scope="module", autouse=True)
def _hydra() -> Iterator[None]:
    """The schema registered and Hydra set up once, as an app does once per run: each case
    composes its own configuration with its overrides."""
    register_configs()
    with initialize_config_module("perseus.conf", version_base="1.3"):
        yield


def _compose(*overrides: str, name: str = "perseus_train") -> Any:
    return compose(name, overrides=list(overrides))


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        to_object(_compose(*overrides))
    return str(info.value)


def _float_keys() -> List[str]:
    return [key for key, allowed in RANGES.items() if not allowed.integer]


def _outside(allowed: Range) -> List[Any]:
    """Values just outside each bound of ``allowed`` (of the key's type)."""
    values: List[Any] = []
    if allowed.ge is not None:
        values.append(allowed.ge - (1 if allowed.integer else 1e-9))
    if allowed.gt is not None:
        values.append(allowed.gt)
    if allowed.le is not None:
        values.append(allowed.le + 1 if allowed.integer else allowed.le * 2 + 1)
    if allowed.lt is not None:
        values.append(allowed.lt)
    return values


NON_FINITE = [(key, text) for key in _float_keys() for text in ("nan", "inf", "-inf")]
OUTSIDE = [(key, value) for key, allowed in RANGES.items() for value in _outside(allowed)]


@functools.cache
def _refused_together(overrides: Tuple[str, ...]) -> Dict[str, List[str]]:
    """Every override composed at once: per key, the problem lines naming it.

    The validation reports every problem at once, one line each, so one composition checks
    every key of a kind (each case still asserts its own key's line); a Hydra composition
    costs about 80 ms, a case of its own each made this module 30 s of the unit tier. No
    problem is reported that no override caused, and none is reported twice.
    """
    lines = _error(*overrides).splitlines()
    if len(overrides) == 1:
        (line,) = lines
        assert line.startswith("invalid configuration: "), line
        return {overrides[0].split("=", 1)[0]: [line[len("invalid configuration: ") :]]}
    assert lines[0] == "invalid configuration:" and len(lines) == len(overrides) + 1, lines
    by_key: Dict[str, List[str]] = {}
    for line in lines[1:]:
        assert line.startswith("  - "), line
        by_key.setdefault(line[4:].split("=", 1)[0], []).append(line[4:])
    return by_key


# Keys composed on their own: their default follows another key's value (train.max_steps),
# so the same bad value in both is one problem, said once.
ALONE = {"profiler.job_iterations"}


def _round(cases: List[Tuple[str, Any]], key: str, value: Any) -> Tuple[str, ...]:
    """The overrides composed with ``key=value``: the n-th value of every key, n as ``value``'s.

    A number is typed as its ``repr``, a text (``nan``) as it is.
    """
    if key in ALONE:
        return (f"{key}={_typed(value)}",)
    nth = [v for k, v in cases if k == key].index(value)
    values: Dict[str, List[Any]] = {}
    for k, v in cases:
        if k not in ALONE:
            values.setdefault(k, []).append(v)
    return tuple(f"{k}={_typed(vs[nth])}" for k, vs in values.items() if len(vs) > nth)


def _typed(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


@pytest.mark.parametrize(("key", "text"), NON_FINITE)
def test_every_float_key_refuses_nan_and_infinity(key: str, text: str) -> None:
    problems = _refused_together(_round([(k, text) for k in _float_keys()], key, text))
    (line,) = problems[key]  # one problem, one line
    assert line.startswith(f"{key}=") and "not finite" in line


@pytest.mark.parametrize(("key", "value"), OUTSIDE)
def test_every_ranged_key_refuses_values_just_outside(key: str, value: Any) -> None:
    (line,) = _refused_together(_round(OUTSIDE, key, value))[key]
    assert line.startswith((f"{key}={value!r}:", f"{key}={float(value)!r}:")), line
    assert "must be" in line


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        # The cases.
        (["planner.p2p_power_w=inf"], ["planner.p2p_power_w=inf", "not finite"]),
        (["energy=slowdown", "energy.max_slowdown=nan"], ["energy.max_slowdown=nan"]),
        (["energy=deadline", "energy.iteration_time_s=nan"], ["energy.iteration_time_s=nan"]),
        (["gpu.emulated.time_scale=nan"], ["gpu.emulated.time_scale=nan"]),
        (["gpu.emulated.time_scale=inf"], ["gpu.emulated.time_scale=inf"]),
        (["train.max_steps=-1"], ["train.max_steps=-1", "integer in 1.."]),
        (["server.request_timeout_s=-1"], ["server.request_timeout_s=-1.0", "> 0"]),
        (["server.rank_timeout_s=-1"], ["server.rank_timeout_s=-1.0"]),
        (["server.start_timeout_s=0"], ["server.start_timeout_s=0.0"]),
        # p2p power: one value or one per stage.
        (["planner.p2p_power_w=[80,nan]"], ["planner.p2p_power_w[1]=nan"]),
        (["planner.p2p_power_w=[80,-1]"], ["planner.p2p_power_w[1]=-1", ">= 0"]),
        (["planner.p2p_power_w=[]"], ["planner.p2p_power_w=[]", "one per pipeline stage"]),
        (["planner.p2p_power_w=abc"], ["planner.p2p_power_w='abc'", "not str"]),
        (["planner.p2p_power_w=true"], ["planner.p2p_power_w=True", "not bool"]),
        (["planner.p2p_power_w={a:1}"], ["planner.p2p_power_w=", "not dict"]),
        (["planner.p2p_power_w=1e9"], ["planner.p2p_power_w=1000000000.0", "<= 10000 W"]),
        # Policies and the key they need.
        (["energy=slowdown", "energy.max_slowdown=null"], ["energy=slowdown needs"]),
        (["energy=deadline"], ["energy=deadline needs energy.iteration_time_s"]),
        (["energy=deadline", "energy.iteration_time_s=0"], ["energy.iteration_time_s=0.0"]),
        (["energy=slowdown", "energy.max_slowdown=-0.05"], ["energy.max_slowdown=-0.05"]),
        (["energy=zeus_cost", "energy.eta=1.5"], ["energy.eta=1.5", "<= 1"]),
        (["energy=zeus_cost", "energy.eta=nan"], ["energy.eta=nan"]),
        # Keys that must agree.
        (
            ["gpu.emulated.power_limit_min_w=500", "gpu.emulated.power_limit_max_w=400"],
            ["power_limit_min_w=500.0 is above gpu.emulated.power_limit_max_w=400.0"],
        ),
        (["train.nnodes=2", "train.node_rank=2"], ["train.node_rank=2: must be in 0..1"]),
        (
            ["runtime.mode=measure", "train.max_steps=3"],
            ["train.max_steps=3 stops before", "= 7 iterations"],
        ),
        # Strings other programs read.
        (["server.url=localhost:7787"], ["server.url='localhost:7787'", "http://HOST:PORT"]),
        (["server.url=ftp://example.org"], ["server.url='ftp://example.org'"]),
        (["server.url=http://"], ["server.url='http://'"]),
        (["server.url=http://host:99999"], ["server.url='http://host:99999'"]),
        (["server.token='a b'"], ["server.token", "without spaces"]),
        (["server.job_id='a/b'"], ["server.job_id='a/b'", "letters, digits"]),
        (["server.job_id=" + "x" * 65], ["server.job_id=", "1 to 64"]),
        (["planner.solver='LP!'"], ["planner.solver='LP!'"]),
        (["server.host=''"], ["server.host is empty"]),
        (["train.master_addr=' '"], ["train.master_addr is empty"]),
        (["runtime.mode=plan"], ["runtime.mode=plan needs runtime.plan"]),
        # Counts, sizes and seeds.
        (["parallelism.num_microbatches=-3"], ["parallelism.num_microbatches=-3"]),
        (["model.hidden_size=0"], ["model.hidden_size=0"]),
        (["model.vocab_size=0"], ["model.vocab_size=0"]),
        (["train.seed=-1"], ["train.seed=-1", "0..4294967295"]),
        (["train.seed=" + str(2**40)], ["train.seed=1099511627776"]),
        (["train.max_steps=" + "9" * 40], ["train.max_steps=99999", "integer in 1.."]),
        (["profiler.energy_rise_patience=5000"], ["profiler.energy_rise_patience=5000"]),
        (["profiler.min_frequency_mhz=0"], ["profiler.min_frequency_mhz=0"]),
        (["server.port=0"], ["server.port=0", "1..65535"]),
        (["train.master_port=70000"], ["train.master_port=70000"]),
        (["train.lr=-1"], ["train.lr=-1.0"]),
        (["gpu.emulated.energy_noise=2"], ["gpu.emulated.energy_noise=2.0"]),
    ],
)
def test_named_bad_values(overrides: List[str], fragments: List[str]) -> None:
    message = _error(*overrides)
    for fragment in fragments:
        assert fragment in message, message


def test_every_problem_at_once_one_line_each() -> None:
    message = _error(
        "planner.p2p_power_w=inf",
        "gpu.emulated.time_scale=nan",
        "train.max_steps=-1",
        "server.port=0",
        "energy=deadline",
    )
    lines = message.splitlines()
    assert lines[0] == "invalid configuration:"
    assert len(lines) == 6 and all(line.startswith("  - ") for line in lines[1:])


def test_a_dataclass_built_in_code_is_checked_too() -> None:
    cfg = PerseusConfig()
    cfg.gpu.emulated.time_scale = math.nan
    cfg.energy.max_slowdown = math.inf
    cfg.server.max_retries = True  # type: ignore[assignment]  # a bool is not a count
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    for fragment in ("time_scale=nan", "max_slowdown=inf", "server.max_retries=True"):
        assert fragment in str(info.value)


@pytest.mark.parametrize("name", ["perseus_train", "perseus_plan", "perseus_server"])
def test_shipped_configs_pass(name: str) -> None:
    from perseus.apps.common import register_configs
    from perseus.apps.server import SCHEMA_NAME, ServerAppConfig, to_server_config

    # perseus-server reads only the server group, through its own schema and conversion.
    register_configs({SCHEMA_NAME: ServerAppConfig})
    convert = to_server_config if name == "perseus_server" else to_object
    assert isinstance(convert(_compose(name=name)), PerseusConfig)


@pytest.mark.parametrize(
    "group",
    sorted(
        f"{folder.name}={path.stem}"
        for folder in (Path(__file__).parents[2] / "conf").iterdir()
        if folder.is_dir() and folder.name in ("model", "parallelism", "gpu", "profiler")
        for path in folder.glob("*.yaml")
    ),
)
def test_every_shipped_group_option_is_within_range(group: str) -> None:
    to_object(_compose(group))


def _wire_bounds(model: Any) -> List[Tuple[str, Bound]]:
    import typing

    hints = typing.get_type_hints(model, include_extras=True)
    found = []
    for f in dataclasses.fields(model):
        hint = hints[f.name]
        for arg in (hint, *typing.get_args(hint)):
            for extra in getattr(arg, "__metadata__", ()):
                if isinstance(extra, Bound):
                    found.append((f.name, extra))
    return found


@pytest.mark.parametrize(
    ("prefix", "model"), [("profiler.", ProfilerSettings), ("energy.", EnergySettings)]
)
def test_config_ranges_are_within_the_servers_bounds(prefix: str, model: Any) -> None:
    # A configuration that passes validate() is never refused by the server's bounds.
    pairs = [(RANGES[prefix + n], b) for n, b in _wire_bounds(model) if prefix + n in RANGES]
    assert pairs
    for allowed, bound in pairs:
        _assert_within(allowed, bound)
    _assert_within(P2P_POWER_W, dict(_wire_bounds(JobSpec))["p2p_power_w"])


def _assert_within(allowed: Range, bound: Bound) -> None:
    c = bound.constraints
    low = allowed.ge if allowed.ge is not None else allowed.gt
    high = allowed.le if allowed.le is not None else allowed.lt
    for key in ("ge", "gt"):
        if key in c:
            assert low is not None and low >= c[key], (allowed, bound)
    for key in ("le", "lt"):
        if key in c:
            assert high is not None and high <= c[key], (allowed, bound)

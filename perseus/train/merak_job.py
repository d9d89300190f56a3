"""framework=merak: the zoo model as a merak-zeus ``PipelineModule``, trained by Merak's engine.

Merak (github.com/ml-energy/merak-zeus) is not on PyPI and pins Python 3.9 with torch 1.10, so its
ranks run in the Merak environment: ``train.python`` names that environment's interpreter
(``scripts/merak-env`` builds it from a clone and prints the path). The launcher, the
coordination server and the report stay in Perseus's own environment; the ranks read the same
resolved configuration and write the same outputs as with the other frameworks.

:func:`check` runs in the launcher and again in every rank; :func:`check_launch` runs in the
launcher only, before any rank starts (it asks the ranks' interpreter what it has); :func:`run`
runs in every rank. The model is the zoo's layer sequence cut at ``model.partition``
(handed to Merak as a ``custom:`` partition) rather than a traced Hugging Face model: each rank
builds only its own stage's layers, and a tied embedding and output head on the first and last
stages are tied by Merak itself (``tie_dims``). ``import perseus.adapters.merak`` comes before
the engine is built, so Perseus replaces merak-zeus's Zeus frequency optimizer (one clock
controller) and sees every forward and backward.

``framework.options``, after the options of Merak's own run script:

* ``train_schedule``: ``1f1b`` (default), ``ds_default``, ``early_recompute_1f1b`` or
  ``last_no_recompute_1f1b`` (``--train_schedule``; the schedules whose order is 1F1B).
* ``checkpoint_num_layers``: layers per activation checkpoint, 0 = none (default;
  ``--checkpoint_num_layers``). The first layer (it takes token ids) is never checkpointed.

Merak hard-codes CUDA, so a rank without a usable CUDA device stops with a clear error before
training (the adapter's own tests run Merak on CPU through a test-only redirection).

Everything a Merak rank imports runs in the Merak environment (Python 3.9, torch 1.10, the core
dependencies): ``tests/unit/test_architecture.py`` checks this module's import closure.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from perseus.config import PerseusConfig
from perseus.errors import ConfigError

logger = logging.getLogger(__name__)

SCHEDULES = ("1f1b", "ds_default", "early_recompute_1f1b", "last_no_recompute_1f1b")
DEFAULT_OPTIONS: Dict[str, Any] = {"train_schedule": "1f1b", "checkpoint_num_layers": 0}
FIX_ENV = (
    "build the Merak environment with scripts/merak-env (from a clone of "
    "github.com/ml-energy/merak-zeus) and set train.python to the interpreter it prints"
)

# Run by the configured interpreter: what a Merak rank will find there (one JSON line).
PROBE = """
import json, sys
found = {"python": list(sys.version_info[:2])}
try:
    import Merak.runtime.pipe_engine, torch, perseus, perseus.adapters.merak
    found["torch"] = torch.__version__
    found["perseus"] = perseus.__file__
    cuda = torch.cuda.is_available()
    if not cuda:
        try:
            torch.cuda.current_device()
            cuda = True
        except Exception:
            pass
    found["cuda"] = cuda
except Exception as exc:
    found["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(found))
"""


def options(cfg: PerseusConfig) -> Dict[str, Any]:
    """``framework.options`` over :data:`DEFAULT_OPTIONS`, checked.

    Raises:
        ConfigError: an unknown option or a bad value, naming the choices.
    """
    given = dict(cfg.framework.options or {})
    unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigError(
            f"framework=merak has no option(s) {unknown}: framework.options takes "
            f"{sorted(DEFAULT_OPTIONS)}"
        )
    merged = {**DEFAULT_OPTIONS, **given}
    if merged["train_schedule"] not in SCHEDULES:
        raise ConfigError(
            f"framework.options.train_schedule={merged['train_schedule']!r}: Perseus follows "
            f"Merak's 1F1B schedules {list(SCHEDULES)}"
        )
    layers = merged["checkpoint_num_layers"]
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise ConfigError(
            f"framework.options.checkpoint_num_layers={layers!r}: an integer >= 0 (0 = off)"
        )
    return merged


def check(cfg: PerseusConfig) -> None:
    """Fail, with the fix, where this Merak job cannot run: options, parallelism, partition.

    Raises:
        ConfigError: a bad option, ``parallelism.tp`` other than 1 (the zoo's layers are not
            tensor-parallel), or a partition that does not fit the model.
    """
    from perseus.models.partition import partition
    from perseus.models.zoo import describe

    options(cfg)
    if cfg.parallelism.tp != 1:
        raise ConfigError(
            f"framework=merak with parallelism.tp={cfg.parallelism.tp}: the model zoo's layers "
            "are not tensor-parallel; use parallelism.tp=1"
        )
    partition(describe(cfg.model), cfg.model.partition, cfg.parallelism.pp)


def check_launch(cfg: PerseusConfig) -> None:
    """Before any rank starts: ``train.python`` must be a Merak environment.

    That is Python 3.9, torch 1.10, Merak and Perseus importable (Perseus from this
    installation), and a usable CUDA device.

    Raises:
        ConfigError: listing every problem found.
    """
    python = cfg.train.python
    if not python:
        raise ConfigError(f"framework=merak runs its ranks in Merak's own environment: {FIX_ENV}")
    problems = probe_problems(python)
    if problems:
        raise ConfigError(
            f"train.python={python} cannot run Merak ranks: {'; '.join(problems)}. Fix: {FIX_ENV}"
        )


def probe_problems(python: str) -> List[str]:
    """What keeps ``python`` from running a Merak rank (empty: nothing)."""
    path = Path(python).expanduser().absolute()
    if not (path.is_file() and os.access(path, os.X_OK)):
        return ["no such executable"]
    try:
        done = subprocess.run(
            [str(path), "-W", "ignore", "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tempfile.gettempdir(),
            check=False,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return [f"it did not answer ({exc})"]
    problems = []
    if found["python"] != [3, 9]:
        problems.append(f"it is Python {'.'.join(map(str, found['python']))}, Merak needs 3.9")
    if "error" in found:
        problems.append(f"importing Merak and Perseus there fails ({found['error']})")
        return problems
    if not str(found["torch"]).startswith("1.10."):
        problems.append(f"it has torch {found['torch']}, Merak pins 1.10")
    import perseus

    here = Path(perseus.__file__).resolve().parent
    if Path(found["perseus"]).resolve().parent != here:
        problems.append(f"its perseus is {found['perseus']}, not this one ({here})")
    if not found["cuda"]:
        problems.append(
            "no CUDA device is usable there, and merak-zeus hard-codes CUDA: run on NVIDIA "
            "GPUs (framework=deepspeed runs on CPU with the emulated GPU)"
        )
    return problems


def run(cfg: PerseusConfig) -> int:
    """Train with Merak's pipeline engine until the loop stops; returns iterations run."""
    try:
        import Merak  # first: it replaces torch.nn.Linear (undone while our layers are built)
    except ImportError as exc:
        raise ConfigError(
            f"framework=merak: this rank's Python cannot import Merak ({exc}); {FIX_ENV}"
        ) from exc
    import torch
    import torch.distributed as dist

    from perseus.models.data import batches
    from perseus.models.zoo import describe
    from perseus.train.loop import run_loop, write_rank_steps

    opts = options(cfg)
    _require_cuda(torch)
    par = cfg.parallelism
    _own_rendezvous()
    Merak.init(par.pp, par.tp, par.dp, backend="nccl" if torch.cuda.is_available() else "gloo")
    import perseus.adapters.merak  # noqa: F401  (before the engine is built)

    description = describe(cfg.model)
    engine = build_engine(cfg, opts, description)
    data = batches(
        description,
        par.microbatch_size,
        seed=cfg.train.seed,
        dataset=cfg.model.dataset,
        shard=engine.grid.get_data_parallel_rank(),
        num_shards=par.dp,
    )

    def step() -> float:
        loss = engine.train_batch(data_iter=data)
        return float(loss.item()) if loss is not None else float("nan")

    steps = run_loop(cfg, step, is_rank0=dist.get_rank() == 0)
    if cfg.output_dir:
        write_rank_steps(Path(cfg.output_dir), dist.get_rank())
    return steps


def _own_rendezvous() -> None:
    """Meet on a store of this torch: the launcher's elastic agent runs another torch version.

    The launcher names a port (env :data:`~perseus.train.worker.RANK_STORE_PORT_ENV`); global
    rank 0 hosts the store there instead of joining the agent's (whose protocol torch 1.10 does
    not speak).
    """
    from perseus.train.worker import RANK_STORE_PORT_ENV

    port = os.environ.get(RANK_STORE_PORT_ENV)
    if port:
        os.environ["MASTER_PORT"] = port
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"


def _require_cuda(torch: Any) -> None:
    if torch.cuda.is_available():
        return
    try:
        torch.cuda.current_device()
    except Exception as exc:
        raise ConfigError(
            "framework=merak needs a CUDA device in every rank: merak-zeus hard-codes CUDA "
            f"(torch.cuda.current_device() failed here: {exc}). Run on NVIDIA GPUs, or use "
            "framework=deepspeed (runs on CPU with the emulated GPU)"
        ) from None


def build_engine(cfg: PerseusConfig, opts: Dict[str, Any], description: Any) -> Any:
    """Build a Merak ``PipelineEngine`` holding this rank's stage of the zoo model."""
    import Merak
    import torch
    import torch.distributed as dist
    from Merak.runtime.pipe_engine import PipelineEngine
    from Merak.utils.merak_args import MerakArguments, manual_set_args

    from perseus.models.losses import loss_fn
    from perseus.models.partition import partition

    par, model = cfg.parallelism, cfg.model
    parts = partition(description, model.partition, par.pp)
    stage = Merak.get_topo().get_coord(dist.get_rank()).pipe
    tied = any(layer.tie_key is not None for layer in description.layers)
    tie_shape = torch.Size([model.vocab_size, model.hidden_size]) if tied else None
    with _real_linear():
        layers = stage_layers(description, parts, stage, cfg.train.seed, tie_shape)
    args = MerakArguments(
        output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="perseus-merak-"),
        per_device_train_batch_size=par.microbatch_size,
        gradient_accumulation_steps=par.num_microbatches,
        train_schedule=opts["train_schedule"],
        checkpoint_num_layers=opts["checkpoint_num_layers"],
        model_name=model.name,
        seed=cfg.train.seed,
        wall_clock_breakdown=False,
    )
    manual_set_args(args)  # Merak's engine reads its arguments from this global
    num_inputs = 2 if description.family == "t5" else 1

    def merak_loss(outputs: Any, labels: Any) -> Any:
        return loss_fn(outputs, labels[0])

    module = _pipeline_module_class()(
        layers=layers,
        loss_fn=merak_loss,
        topology=Merak.get_topo(),
        communicaiton_grid=Merak.get_grid(),
        partition_method="custom:" + ",".join(str(p) for p in parts),
        activation_checkpoint_interval=opts["checkpoint_num_layers"],
        tie_dims={tie_shape} if tie_shape is not None else set(),
        input_to_shard_dic={f"input_{i}": 0 for i in range(num_inputs)},
    )
    module.tie_modules()  # as MerakTrainer does: groups for the tied weights, synchronized
    engine = PipelineEngine(
        args=args,
        model=module,
        optimizer=torch.optim.Adam(module.parameters(), lr=cfg.train.lr),
        lr_scheduler=None,
        mpu=module.mpu(),
        dist_init_required=False,
        config={
            "train_micro_batch_size_per_gpu": par.microbatch_size,
            "gradient_accumulation_steps": par.num_microbatches,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        },
        train_schedule=opts["train_schedule"],
        return_logits=False,
    )
    engine.input_to_stage_dic = module.input_to_stage_dic  # as MerakTrainer does
    engine.batch_fn = _flat_batch
    return engine


def _flat_batch(batch: Any) -> Any:
    """Merak loads ``batch[:num_inputs]`` on the first stage and the rest on the last."""
    inputs, labels = batch
    return (*inputs, labels) if isinstance(inputs, tuple) else (inputs, labels)


@contextmanager
def _real_linear() -> Iterator[None]:
    """``torch.nn.Linear`` as torch defines it (``import Merak`` made it a proxy class)."""
    import Merak
    import torch

    proxy = torch.nn.Linear
    torch.nn.Linear = Merak.get_patched_func()[1]  # type: ignore[misc]
    try:
        yield
    finally:
        torch.nn.Linear = proxy  # type: ignore[misc]


def _pipeline_module_class() -> type:
    from Merak.modules.module import PipelineModule

    class PerseusMerakModule(PipelineModule):  # type: ignore[misc]
        """Merak's PipelineModule that never checkpoints the layer taking the model inputs.

        Merak's checkpoint function is reentrant: around a layer whose inputs need no gradient
        (token ids) it would cut the layer's parameters off the backward pass.
        """

        def _is_checkpointable(self, funcs: List[Any]) -> bool:
            if any(getattr(f, "takes_model_inputs", False) for f in funcs):
                return False
            return bool(super()._is_checkpointable(funcs))

    return PerseusMerakModule


def stage_layers(
    description: Any, parts: List[int], stage: int, seed: int, tie_shape: Optional[Any]
) -> List[Any]:
    """Every layer of the model for Merak: this stage's built, the others placeholders.

    A layer is seeded with ``seed + index``, so it starts the same on whichever stage builds it.
    A tied layer repeated on another stage (the output head) gets its own copy of the shared
    module; Merak ties the copies' ``weight`` (all-reduced gradients, synchronized at start).
    """
    import torch

    from perseus.models.build import tied_call

    merak_layer, tied_copy = _layer_classes()
    layers: List[Any] = []
    shared: Dict[str, Any] = {}
    for index, layer in enumerate(description.layers):
        if not parts[stage] <= index < parts[stage + 1]:
            layers.append(_Elsewhere(tie_shape if layer.tie_key is not None else None))
            continue
        torch.manual_seed(seed + index)
        if layer.tie_key is not None and layer.tie_key in shared:
            module = tied_call(shared[layer.tie_key], layer)  # both on this stage (pp=1)
        else:
            module = layer.module(**layer.kwargs)
            if layer.tie_key is not None:
                _check_tie_shape(module, tie_shape, description.name)
                if layer.forward_fn is None:
                    shared[layer.tie_key] = module
                else:
                    module = tied_copy(module, layer.forward_fn)
        layers.append(merak_layer(module, index == 0))
    return layers


def _check_tie_shape(module: Any, tie_shape: Optional[Any], model_name: str) -> None:
    weight = getattr(module, "weight", None)
    if tie_shape is None or weight is None or tuple(weight.shape) != tuple(tie_shape):
        raise ConfigError(
            f"model {model_name!r}: Merak ties weights by shape, and the tied embedding's "
            f"weight is not model.vocab_size x model.hidden_size {tuple(tie_shape or ())}"
        )


class _Shape:
    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _Elsewhere:
    """A layer of another stage: only what Merak's tying reads (``modules()``, ``weight``)."""

    def __init__(self, tie_shape: Optional[Any]) -> None:
        self.__name__ = "(built by its own stage)"  # what Merak prints for it
        if tie_shape is not None:
            self.weight = _Shape(tie_shape)

    def modules(self) -> Iterator[Any]:
        """Merak looks for tied weights in every layer's modules."""
        yield self


@functools.lru_cache(maxsize=1)
def _layer_classes() -> Tuple[type, type]:
    """The module classes :func:`stage_layers` wraps zoo layers in (torch imported lazily)."""
    import torch

    class MerakLayer(torch.nn.Module):
        """A zoo layer called with one argument: Merak unpacks tuples into positional ones."""

        def __init__(self, layer: Any, takes_model_inputs: bool) -> None:
            super().__init__()
            self.layer = layer
            self.takes_model_inputs = takes_model_inputs

        def forward(self, *args: Any) -> Any:
            return self.layer(args[0] if len(args) == 1 else tuple(args))

    class TiedCopy(torch.nn.Module):
        """A tied layer on another stage than the shared module: a copy, tied by Merak."""

        def __init__(self, shared: Any, forward_fn: Callable[..., Any]) -> None:
            super().__init__()
            self.shared = shared
            self.forward_fn = forward_fn

        def forward(self, x: Any) -> Any:
            return self.forward_fn(self.shared, x)

    return MerakLayer, TiedCopy

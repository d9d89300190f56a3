"""Perseus's configuration: its typed schema, its enums, its validation, and the bounds it checks.

* :mod:`perseus.config.schema`: one dataclass per config group (``PerseusConfig`` and its parts),
  the keys every YAML file and command-line override may set.
* :mod:`perseus.config.enums`: the keys with a fixed set of values.
* :mod:`perseus.config.validation`: the whole configuration checked at once, one line per problem.
* :mod:`perseus.config.bounds` and :mod:`perseus.config.numbers`: the ranges the configuration and
  the coordination server's wire both check, and the one check of a number (standard library
  only: the training process and the wire import them without the schema).

``from perseus.config import PerseusConfig`` (and every other name of the schema and the enums)
works as it always did; the schema is imported on first use, so importing ``perseus.config.numbers``
or ``perseus.config.bounds`` loads no configuration library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict

from perseus.lazy_names import lazy_names

if TYPE_CHECKING:
    from perseus.config.enums import (
        PIPELINE_POLICIES as PIPELINE_POLICIES,
    )
    from perseus.config.enums import (
        ConfigChoice as ConfigChoice,
    )
    from perseus.config.enums import (
        EmulatedCounter as EmulatedCounter,
    )
    from perseus.config.enums import (
        EnergyPolicy as EnergyPolicy,
    )
    from perseus.config.enums import (
        Framework as Framework,
    )
    from perseus.config.enums import (
        GPUBackend as GPUBackend,
    )
    from perseus.config.enums import (
        GPUOnUnsupported as GPUOnUnsupported,
    )
    from perseus.config.enums import (
        PlannerEffort as PlannerEffort,
    )
    from perseus.config.enums import (
        PlannerScope as PlannerScope,
    )
    from perseus.config.enums import (
        PowerLimitSelector as PowerLimitSelector,
    )
    from perseus.config.enums import (
        ProfilerMode as ProfilerMode,
    )
    from perseus.config.enums import (
        RuntimeMode as RuntimeMode,
    )
    from perseus.config.schema import (
        DEFAULT_SERVER_PORT as DEFAULT_SERVER_PORT,
    )
    from perseus.config.schema import (
        EmulatedGPUConfig as EmulatedGPUConfig,
    )
    from perseus.config.schema import (
        EnergyConfig as EnergyConfig,
    )
    from perseus.config.schema import (
        FrameworkConfig as FrameworkConfig,
    )
    from perseus.config.schema import (
        GPUConfig as GPUConfig,
    )
    from perseus.config.schema import (
        ModelConfig as ModelConfig,
    )
    from perseus.config.schema import (
        ParallelismConfig as ParallelismConfig,
    )
    from perseus.config.schema import (
        PerseusConfig as PerseusConfig,
    )
    from perseus.config.schema import (
        PlannerConfig as PlannerConfig,
    )
    from perseus.config.schema import (
        PowerLimitConfig as PowerLimitConfig,
    )
    from perseus.config.schema import (
        ProfilerConfig as ProfilerConfig,
    )
    from perseus.config.schema import (
        RuntimeConfig as RuntimeConfig,
    )
    from perseus.config.schema import (
        ServerConfig as ServerConfig,
    )
    from perseus.config.schema import (
        TrainConfig as TrainConfig,
    )

_MODULE_OF: Dict[str, str] = {
    "PIPELINE_POLICIES": "perseus.config.enums",
    "ConfigChoice": "perseus.config.enums",
    "EmulatedCounter": "perseus.config.enums",
    "EnergyPolicy": "perseus.config.enums",
    "Framework": "perseus.config.enums",
    "GPUBackend": "perseus.config.enums",
    "GPUOnUnsupported": "perseus.config.enums",
    "PlannerEffort": "perseus.config.enums",
    "PlannerScope": "perseus.config.enums",
    "PowerLimitSelector": "perseus.config.enums",
    "ProfilerMode": "perseus.config.enums",
    "RuntimeMode": "perseus.config.enums",
    "DEFAULT_SERVER_PORT": "perseus.config.schema",
    "EmulatedGPUConfig": "perseus.config.schema",
    "EnergyConfig": "perseus.config.schema",
    "FrameworkConfig": "perseus.config.schema",
    "GPUConfig": "perseus.config.schema",
    "ModelConfig": "perseus.config.schema",
    "ParallelismConfig": "perseus.config.schema",
    "PerseusConfig": "perseus.config.schema",
    "PlannerConfig": "perseus.config.schema",
    "PowerLimitConfig": "perseus.config.schema",
    "ProfilerConfig": "perseus.config.schema",
    "RuntimeConfig": "perseus.config.schema",
    "ServerConfig": "perseus.config.schema",
    "TrainConfig": "perseus.config.schema",
}
__all__ = sorted(_MODULE_OF)


__getattr__, __dir__ = lazy_names("perseus.config", _MODULE_OF, globals())

"""One exception tree for Perseus.

Every message says what went wrong and how to fix it. Catch :class:`PerseusError` to handle
anything Perseus raises on purpose.
"""

from __future__ import annotations


class PerseusError(Exception):
    """Base of every error Perseus raises on purpose."""


class ConfigError(PerseusError, ValueError):
    """A configuration value is missing, misspelled or out of range."""


class ProfileError(PerseusError, ValueError):
    """A profile CSV is malformed; the message names the file, row and problem."""


class PlanError(PerseusError, ValueError):
    """A plan file is malformed or does not match the pipeline it is applied to."""


class NonFiniteError(PerseusError, ValueError):
    """A number that must be finite is NaN or infinite; the message names where it is.

    Raised, for example, instead of writing ``NaN`` or ``Infinity`` into a JSON file (which
    strict JSON readers refuse).
    """


class ScheduleMismatchError(PerseusError, RuntimeError):
    """The training framework ran an instruction the plan did not expect at that point."""


class SolverError(PerseusError, RuntimeError):
    """A planner solver failed or was given an instance it cannot handle."""


class GPUError(PerseusError, RuntimeError):
    """Base of GPU-layer errors."""


class GPUNotFoundError(GPUError):
    """No usable GPU (no driver, no device, or an index out of range)."""


class GPUPermissionError(GPUError):
    """Changing clocks or power limits needs privileges this process does not have."""


class GPUNotSupportedError(GPUError):
    """The device or driver does not support the requested operation."""


class GPUValueError(GPUError, ValueError):
    """A clock or power value outside what the device supports."""


class GPUOwnershipError(GPUError):
    """Another controller already owns this GPU's clocks or power limit."""


class GPUTimeoutError(GPUError):
    """A GPU driver call did not return in time (the driver is not responding)."""


class GPUPreflightError(GPUError):
    """A rank's start-up check found that its GPU cannot do what the job needs."""


class AdapterError(PerseusError, RuntimeError):
    """A framework adapter cannot patch the installed framework (missing or changed names)."""


class JobShapeError(ConfigError):
    """A configured job shape (stages, microbatches, ...) disagrees with the training engine."""


class ServerError(PerseusError, RuntimeError):
    """The coordination server rejected a request or could not be reached."""


class RendezvousError(ServerError):
    """Perseus cannot run online for this launch; every rank falls back to default clocks.

    Attributes:
        shared: Every rank has this problem (rank 0 reports it; the others stay quiet).
    """

    def __init__(self, message: str, shared: bool = False) -> None:
        super().__init__(message)
        self.shared = shared


class BatchSizeError(PerseusError, RuntimeError):
    """The batch-size optimizer cannot go on (no batch size reaches the target, bad state)."""


class RecordingError(PerseusError, ValueError):
    """A recording of a GPU's energy counter cannot be replayed (missing, malformed, too short)."""


class ExtraMissingError(PerseusError, ImportError):
    """An optional feature needs a package that its pip extra installs, and it is missing."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs the package {package!r}, which is not installed: "
            f"`pip install 'perseus-energy[{extra}]'`"
        )
        self.extra = extra

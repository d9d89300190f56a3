"""Device profiles for the emulated GPU: the bundled published ones, and loading any CSV.

Four measured stage profiles from the SOSP '24 Perseus artifact ship in
``perseus/data/sosp24/`` (Apache-2.0; see the README there). The default device profile is
GPT-3 175B on A100 SXM. Profiles load with :mod:`perseus.formats.profile.table` (standard
library only, keeping pandas off the training path).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Union

from perseus.errors import ConfigError
from perseus.formats.profile.table import Profile, read_profile_csv

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "sosp24"
DEFAULT_PROFILE_NAME = "gpt3-175b+a100_sxm_bf16"
# GPU power while blocked on pipeline communication, measured by the profiles' authors.
BLOCKING_POWER_W = {"a100": 83.64, "a40": 70.38}


def bundled_profile_names() -> List[str]:
    """Names of the bundled profiles (file names without ``.csv``)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.csv"))


def bundled_profile_path(name: str) -> Path:
    """Path of a bundled profile, e.g. ``bundled_profile_path("bloom+a40_bf16")``.

    Raises:
        ConfigError: for an unknown name (the message lists the known ones).
    """
    stem = name[: -len(".csv")] if name.endswith(".csv") else name
    path = BUNDLED_DIR / f"{stem}.csv"
    if not path.is_file():
        raise ConfigError(
            f"no bundled device profile named {name!r}; choose one of {bundled_profile_names()} "
            "or give the path of a profile CSV (gpu.emulated.profile=...)"
        )
    return path


def default_device_profile_path() -> Path:
    """The bundled GPT-3 175B / A100 SXM profile."""
    return bundled_profile_path(DEFAULT_PROFILE_NAME)


def resolve_profile_path(spec: Optional[str]) -> Path:
    """``gpu.emulated.profile``: None = default, a bundled name, or a CSV path."""
    if spec is None:
        return default_device_profile_path()
    if os.sep not in spec and not spec.endswith(".csv") and (BUNDLED_DIR / f"{spec}.csv").is_file():
        return BUNDLED_DIR / f"{spec}.csv"
    path = Path(spec).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"gpu.emulated.profile={spec!r} is a directory; give a profile CSV or one of the "
            f"bundled names {bundled_profile_names()}"
        )
    if not path.is_file():
        raise ConfigError(
            f"gpu.emulated.profile={spec!r}: no such file; give a profile CSV or one of the "
            f"bundled names {bundled_profile_names()}"
        )
    return path


def load_device_profile(path: Union[str, os.PathLike]) -> Profile:
    """Load a device profile CSV (see :func:`perseus.formats.profile.table.read_profile_csv`).

    Raises:
        ProfileError: naming the file, row and problem.
    """
    return read_profile_csv(path)


def blocking_power_for(path: Union[str, os.PathLike]) -> Optional[float]:
    """The published blocking power (W) of a bundled profile's GPU, None for other files."""
    path = Path(path)
    if path.resolve().parent != BUNDLED_DIR:
        return None
    gpu = path.stem.split("+", 1)[-1].split("_", 1)[0]
    return BLOCKING_POWER_W.get(gpu)

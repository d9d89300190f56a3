"""Saved power-limit profiles: profile a job once, reuse the table on every later run.

One JSON file holds any number of profiles, each keyed by job id, batch size (for recurring jobs
whose batch size changes between runs), GPU model, number of GPUs and the list of power limits
tried. A run whose key matches a saved profile skips profiling and picks its limit from the saved
table. A table saved by the search records what it searched for (``searched_for``: the selector
and its settings) and answers only that: the limits it pruned as clearly worse, and those it did
not confirm, were judged under that selector and may be the best under another. A table without
it (saved before the search pruned, or built elsewhere) measured every limit alike and answers
any selector.
Keys without a batch size are written as before, so files from earlier versions keep matching.

The file is data, read with :mod:`json` only; writes are atomic (temporary file + rename), so a
crash never leaves half a file. Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from perseus.errors import ConfigError
from perseus.formats.atomic_file import write_json_atomic
from perseus.power_limit.selectors import PowerLimitMeasurement

FORMAT = "perseus-power-limit-profile/1"


@dataclass(frozen=True)
class ProfileKey:
    """What must match for a saved profile to stand in for profiling.

    Attributes:
        job_id: The user's name for the recurring job.
        gpu_name: The GPU model.
        num_gpus: GPUs in the whole job.
        power_limits_mw: The limits the optimizer tries, highest first.
        batch_size: The (global) batch size the job trains with; None when it does not matter.
    """

    job_id: str
    gpu_name: str
    num_gpus: int
    power_limits_mw: Sequence[int]
    batch_size: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON form."""
        out: Dict[str, Any] = {
            "job_id": self.job_id,
            "gpu_name": self.gpu_name,
            "num_gpus": self.num_gpus,
            "power_limits_mw": [int(x) for x in self.power_limits_mw],
        }
        if self.batch_size is not None:
            out["batch_size"] = int(self.batch_size)
        return out


def load_profile(
    path: Path, key: ProfileKey, searched_for: Optional[Dict[str, Any]] = None
) -> Optional[List[PowerLimitMeasurement]]:
    """The saved table for ``key`` in ``path``, or None when there is none (or no file).

    Args:
        path: The profile file.
        key: What must match.
        searched_for: What the caller chooses by; a table saved by a search for something else
            is not returned (a table of every limit always is).

    Raises:
        ConfigError: When the file exists but is not a power-limit profile file.
    """
    for entry in _read_entries(path):
        if entry.get("key") != key.to_dict():
            continue
        saved_for = entry.get("searched_for")
        if saved_for is not None and saved_for != searched_for:
            return None
        return [PowerLimitMeasurement.from_dict(row) for row in entry["measurements"]]
    return None


def save_profile(
    path: Path,
    key: ProfileKey,
    measurements: Sequence[PowerLimitMeasurement],
    searched_for: Optional[Dict[str, Any]] = None,
) -> None:
    """Store ``measurements`` under ``key`` in ``path`` (replacing an older entry of that key).

    ``searched_for``: what the search that measured them was looking for (None: every limit was
    measured alike).
    """
    entries = [e for e in _read_entries(path) if e.get("key") != key.to_dict()]
    entry: Dict[str, Any] = {
        "key": key.to_dict(),
        "measurements": [m.to_dict() for m in measurements],
    }
    if searched_for is not None:
        entry["searched_for"] = searched_for
    entries.append(entry)
    write_json_atomic(path, {"format": FORMAT, "profiles": entries}, indent=2)


def load_other_batch_sizes(
    path: Path, key: ProfileKey, searched_for: Optional[Dict[str, Any]] = None
) -> Dict[int, List[PowerLimitMeasurement]]:
    """The saved tables of ``key``'s job at its other batch sizes (same GPUs, same limits).

    Only tables that answer ``searched_for`` (as in :func:`load_profile`) are returned.

    Raises:
        ConfigError: When the file exists but is not a power-limit profile file.
    """
    same = {k: v for k, v in key.to_dict().items() if k != "batch_size"}
    out: Dict[int, List[PowerLimitMeasurement]] = {}
    for entry in _read_entries(path):
        other = dict(entry.get("key") or {})
        batch_size = other.pop("batch_size", None)
        saved_for = entry.get("searched_for")
        if saved_for is not None and saved_for != searched_for:
            continue
        if other == same and batch_size is not None and batch_size != key.batch_size:
            out[int(batch_size)] = [
                PowerLimitMeasurement.from_dict(r) for r in entry["measurements"]
            ]
    return out


def _read_entries(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: cannot read the power-limit profile ({exc}); delete the file or point "
            "energy.power_limit.profile_path elsewhere to profile again"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(
            f"{path}: not a power-limit profile (expected format {FORMAT!r}); point "
            "energy.power_limit.profile_path at another file"
        )
    entries = data.get("profiles", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'profiles' must be a list; delete the file to start over")
    return entries

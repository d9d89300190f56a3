"""Honest profiles: a lower clock never looks faster than a higher one beyond the noise.

On a GPU, an instruction at a lower SM clock takes at least as long as at a higher one (flat
where it is memory-bound). A measured profile that says otherwise has been distorted by the
host (a busy CPU lengthening the higher clock's samples, a late launch): planned as measured,
such points give plans "faster than max clocks" that cannot hold and save far less than
predicted. :func:`find_inversions` flags every point whose time is below the fastest higher
clock's by more than the measured noise (and more than :data:`MIN_RELATIVE` of it);
:func:`repair` plans those points as no faster than that higher clock (same power, so their
energy grows with the time), and :func:`describe` says so in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

from perseus.formats.profile.table import Profile

# Flag only inversions larger than this fraction of the higher clock's time: the published
# profiles, measured on quiet real GPUs, wobble by up to 1.8 % between clocks (Bloom on A40).
MIN_RELATIVE = 0.02
# ... and larger than this many combined noise estimates of the two times.
SIGMAS = 3.0

Row = Tuple[int, str, int, float, float]
NoiseKey = Tuple[int, str, int]


@dataclass(frozen=True)
class Inversion:
    """A clock that measured faster than a higher one beyond the noise.

    Attributes:
        stage: Pipeline stage.
        instruction: ``forward`` or ``backward``.
        low_mhz: The lower clock.
        low_time_s: Its measured time.
        high_mhz: The higher clock it beat (the fastest of the higher clocks).
        high_time_s: That clock's measured time.
        noise_s: The combined noise of the two times.
    """

    stage: int
    instruction: str
    low_mhz: int
    low_time_s: float
    high_mhz: int
    high_time_s: float
    noise_s: float

    @property
    def faster_fraction(self) -> float:
        """How much faster the lower clock looked (0.05: 5 % faster)."""
        return 1.0 - self.low_time_s / self.high_time_s


def find_inversions(
    rows: Iterable[Sequence[object]], noise_s: Mapping[NoiseKey, float]
) -> List[Inversion]:
    """Every (stage, instruction, clock) faster than a higher clock beyond the noise.

    Args:
        rows: Profile rows ``(stage, instruction, frequency_mhz, time_s, energy_j)``.
        noise_s: Noise of each row's time (e.g. a standard error), by
            ``(stage, instruction, frequency_mhz)``; missing: 0.
    """
    by_kind: Dict[Tuple[int, str], List[Tuple[int, float]]] = {}
    for stage, instruction, freq, time_s, _ in (_row(r) for r in rows):
        by_kind.setdefault((stage, instruction), []).append((freq, time_s))
    found = []
    for (stage, instruction), points in sorted(by_kind.items()):
        points.sort(reverse=True)  # highest clock first
        best_f, best_t = points[0]
        for freq, time_s in points[1:]:
            noise = math.hypot(
                noise_s.get((stage, instruction, freq), 0.0),
                noise_s.get((stage, instruction, best_f), 0.0),
            )
            margin = max(SIGMAS * noise, MIN_RELATIVE * best_t)
            if time_s < best_t - margin:
                found.append(
                    Inversion(
                        stage=stage,
                        instruction=instruction,
                        low_mhz=freq,
                        low_time_s=time_s,
                        high_mhz=best_f,
                        high_time_s=best_t,
                        noise_s=noise,
                    )
                )
            elif time_s < best_t:
                best_f, best_t = freq, time_s  # within the noise: the new fastest higher clock
    return found


def repair(profile: Profile, inversions: Sequence[Inversion]) -> Profile:
    """``profile`` with every flagged point as slow as the higher clock it beat (same power)."""
    if not inversions:
        return profile
    fixed = {(i.stage, i.instruction, i.low_mhz): i.high_time_s for i in inversions}
    rows = []
    se = dict(profile.energy_se_j)
    for stage, instruction, freq, time_s, energy_j in (_row(r) for r in profile.rows()):
        key = (stage, instruction, freq)
        new_time = fixed.get(key)
        if new_time is not None and new_time > time_s:
            energy_j *= new_time / time_s
            if key in se:
                se[key] *= new_time / time_s
            time_s = new_time
        rows.append((stage, instruction, freq, time_s, energy_j))
    return Profile.from_rows(rows, profile.source, energy_se_j=se, uncertain=profile.uncertain)


def describe(inversions: Sequence[Inversion], limit: int = 3) -> str:
    """One line for the user: how many points, the worst ones, what was done about them."""
    worst = sorted(inversions, key=lambda i: -i.faster_fraction)[:limit]
    examples = ", ".join(
        f"stage {i.stage} {i.instruction} at {i.low_mhz} MHz {1000 * i.low_time_s:.2f} ms vs "
        f"{1000 * i.high_time_s:.2f} ms at {i.high_mhz} MHz"
        for i in worst
    )
    return (
        f"the measured profile has {len(inversions)} point(s) where a lower GPU clock ran "
        f"faster than a higher one beyond the measured noise ({examples}): the host was "
        "probably busy while profiling. They are planned as no faster than the higher clock; "
        "profile on a quieter host for a better plan"
    )


def _row(row: Sequence[object]) -> Row:
    stage, instruction, freq, time_s, energy_j = row
    return (
        int(stage),  # type: ignore[call-overload]
        str(instruction),
        int(freq),  # type: ignore[call-overload]
        float(time_s),  # type: ignore[arg-type]
        float(energy_j),  # type: ignore[arg-type]
    )

"""Profiles for schedules that split the backward: the documented rule where none was measured.

Zero-bubble schedules run a microbatch's backward as two instructions, the input gradient
(``backward_input``, sent on to the previous stage at once) and the weight gradient
(``backward_weight``, run later where a bubble would be). A run of such a schedule measures
both; the published profiles (``perseus/data/sosp24/``) measured the backward whole.
:func:`split_backward` derives the halves from the whole by one rule (``docs/design.md``,
"Profile CSV").
"""

from __future__ import annotations

from perseus.errors import ProfileError
from perseus.formats.profile.table import Profile
from perseus.pipeline_order import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT

#: The input half's share of a backward's time and energy in :func:`split_backward`.
INPUT_FRACTION = 0.5


def split_backward(profile: Profile, input_fraction: float = INPUT_FRACTION) -> Profile:
    """``profile`` where every stage also has ``backward_input`` and ``backward_weight`` rows.

    Where a stage has neither, they are derived from its ``backward`` rows: at every clock the
    input half takes ``input_fraction`` of the backward's time and energy, the weight half the
    rest (so both halves run at the backward's power, and together cost what it costs). The
    default 0.5 is the zero-bubble cost model (the input gradient and the weight gradient each
    cost about one forward, the whole backward two). Measured rows are kept as they are.

    Raises:
        ProfileError: ``input_fraction`` outside (0, 1), a stage with only one of the halves,
            or one without backward rows to derive them from.
    """
    if not 0.0 < input_fraction < 1.0:
        raise ProfileError(
            f"input_fraction={input_fraction!r}: the input half's share of the backward must "
            "lie strictly between 0 and 1"
        )
    rows = profile.rows()
    shares = ((BACKWARD_INPUT, input_fraction), (BACKWARD_WEIGHT, 1.0 - input_fraction))
    for stage in profile.stages():
        halves = [profile.has(stage, kind) for kind, _ in shares]
        if all(halves):
            continue
        if any(halves) or not profile.has(stage, BACKWARD):
            raise ProfileError(
                f"{profile.source}: stage {stage} has "
                + ("only one backward half" if any(halves) else "no backward rows")
                + "; the backward_input and backward_weight rows are derived from a stage's "
                "backward rows"
            )
        for kind, share in shares:
            rows += [
                (stage, kind, m.frequency_mhz, m.time_s * share, m.energy_j * share)
                for m in profile.measurements(stage, BACKWARD)
            ]
    return Profile.from_rows(rows, source=profile.source)

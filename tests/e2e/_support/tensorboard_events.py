"""TensorBoard's own event reader: a run's scalars as the TensorBoard UI would show them."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

Series = Dict[int, float]


def tensorboard_scalars(directory: Path) -> Dict[str, Series]:
    """Every scalar tag under ``directory``: step -> value (the last event of a step wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}

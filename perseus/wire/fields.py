"""The wire's bounded field types and size limits, shared by every message.

Part of :mod:`perseus.wire` (see there). Every size a message may have is capped here; the
annotated types carry their :class:`~perseus.config.checked.Bound`.
"""

from __future__ import annotations

from typing import Annotated

from perseus.config.bounds import JOB_ID_PATTERN, MHZ
from perseus.config.checked import Bound

MAX_STAGES = 512
MAX_MICROBATCHES = 4096
MAX_RANKS = 65536
MAX_CLOCKS = 1024
# Per rank and step: a forward and a backward (or its two halves) per microbatch and chunk.
MAX_INSTRUCTIONS = 3 * MAX_MICROBATCHES * 8
MAX_STEP = 10**12
# Earlier iterations' energies in one step report, and energy counter updates (~10 a second
# on real GPUs; a report is sent per iteration).
MAX_ENERGIES = 4096
MAX_UPDATES = 65536
# A step sequence ("F0,F1,B0,..."; I and W: a backward's halves): at most this many characters.
MAX_SEQUENCE_CHARS = MAX_INSTRUCTIONS * 8
SEQUENCE_PATTERN = r"^([FBIW][0-9]{1,6}(,[FBIW][0-9]{1,6})*)?$"
# A GPU as ``<host>:<index>`` (host name characters only).
GPU_LABEL_PATTERN = r"^[A-Za-z0-9._-]{1,120}:[0-9]{1,6}$"

JobId = Annotated[str, Bound(pattern=JOB_ID_PATTERN)]
Mhz = Annotated[int, Bound.of(MHZ)]
Seconds = Annotated[float, Bound(ge=0.0, le=1e7, allow_inf_nan=False)]
Joules = Annotated[float, Bound(ge=0.0, le=1e15, allow_inf_nan=False)]
RankId = Annotated[int, Bound(ge=0, lt=MAX_RANKS)]
StepId = Annotated[int, Bound(ge=0, le=MAX_STEP)]
# A GPU's temperature (NVML reports whole °C; a sensor reads -40 to 150 at most).
Celsius = Annotated[float, Bound(ge=-50.0, le=200.0, allow_inf_nan=False)]
FORBID_EXTRA = {"extra": "forbid"}  # read by pydantic: unknown keys are a 422

"""Former home of :mod:`perseus.formats.profile_csv`, kept only as an import alias.

Code in this repository imports :mod:`perseus.formats.profile_csv`; this alias keeps imports
written against the old path working (``load_profile`` is ``read_profile_csv``) until every
branch has moved over. Do not add to it.
"""

from perseus.formats.profile_csv import (
    COLUMNS,
    INSTRUCTIONS,
    Measurement,
    Profile,
    blocking_power_per_stage_w,
    read_profile_csv,
)

load_profile = read_profile_csv

__all__ = [
    "COLUMNS",
    "INSTRUCTIONS",
    "Measurement",
    "Profile",
    "blocking_power_per_stage_w",
    "load_profile",
    "read_profile_csv",
]

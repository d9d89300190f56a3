"""Former home of :mod:`perseus.formats.plan_json`, kept only as an import alias.

Code in this repository imports :mod:`perseus.formats.plan_json`; this alias keeps imports
written against the old path working until every branch has moved over. Do not add to it.
"""

from perseus.formats.plan_json import (
    PLAN_FORMAT,
    Plan,
    PlanStep,
    load_plan,
    plan_from_dict,
    plan_from_reference,
)

__all__ = ["PLAN_FORMAT", "Plan", "PlanStep", "load_plan", "plan_from_dict", "plan_from_reference"]

"""The invariant layer: every entry point checks schemes, parameters and data here first."""

from .data import (
    MAX_RANK,
    can_read,
    check_finite,
    check_input,
    check_same_place,
    check_shape,
    is_real_float,
    namespace_of,
)
from .params import CheckedParams, check_params, check_scale_values, check_table, check_zero
from .plan import Plan, check_calibration, check_rounding, plan_for

__all__ = [
    "MAX_RANK",
    "CheckedParams",
    "Plan",
    "can_read",
    "check_calibration",
    "check_finite",
    "check_input",
    "check_params",
    "check_rounding",
    "check_same_place",
    "check_scale_values",
    "check_shape",
    "check_table",
    "check_zero",
    "is_real_float",
    "namespace_of",
    "plan_for",
]

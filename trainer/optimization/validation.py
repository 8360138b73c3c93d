"""What admission checks of an OptimizationJob beyond its CRD's schema and CEL rules.

The API server refuses most bad input with the CRD (bounds, one algorithm, one space, min below
max, a grid over spaces it can enumerate). What is left needs arithmetic CEL does not have, or
the TrainJob webhook: two parameter names that would give one env var, an Int space without a
whole number in it, and a template the TrainJob webhook refuses. (A number beyond a float64's
range is refused by the CRD already: CEL's double() fails on it.)
A grid with more combinations than any search runs, or fewer than numTrials, is no error: the
search takes what it needs and stops when the grid runs out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.apimachinery.errors import FieldError, invalid
from trainer.optimization import search
from trainer.optimization.spaces import NUMERIC_KINDS, numeric, space_of


def validate_optimizationjob(obj: Mapping[str, Any]) -> list[FieldError]:
    """Every reason of ours to refuse an OptimizationJob the CRD admitted, in spec order."""
    errors: list[FieldError] = []
    taken: dict[str, str] = {}  # env var -> the parameter that gives it
    for i, parameter in enumerate((obj.get("spec") or {}).get("parameters") or []):
        path = f"spec.parameters[{i}]"
        name = str(parameter.get("name", ""))
        var = search.env_var_name(name)
        if var in taken:
            errors.append(
                invalid(
                    f"{path}.name",
                    name,
                    f'gives the env var {var}, as parameter "{taken[var]}" does: parameter names '
                    "must differ in more than case and punctuation",
                )
            )
        else:
            taken[var] = name
        errors += _space_errors(parameter, f"{path}.searchSpace")
    return errors


def _space_errors(parameter: Mapping[str, Any], path: str) -> list[FieldError]:
    try:
        kind, space = space_of(parameter)
    except ValueError:
        return []  # the CRD refuses a parameter without a space
    if kind not in NUMERIC_KINDS:
        return []
    numbers = numeric(space, kind)
    if numbers.is_int and numbers.int_low > numbers.int_high:
        return [invalid(f"{path}.{kind}.type", "Int", "no whole number lies between min and max")]
    return []


def first_assignment(obj: Mapping[str, Any]) -> search.Assignment:
    """Trial 0's values: the grid's first combination, or the first random draw (a TPE search
    starts as a random one does). Only for an object :func:`validate_optimizationjob` passed."""
    spec = obj["spec"]
    parameters = spec["parameters"]
    if (spec.get("searchAlgorithm") or {}).get("grid") is not None:
        first = search.grid(parameters, limit=1)
        return first[0] if first else {}
    return search.random_assignment(parameters, search.seed_of(obj), 0)


def template_trainjob(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Trial 0's TrainJob, so that the caller can run the TrainJob webhook's checks on it (the
    runtime exists, the plugins' rules): a template they refuse would fail every trial."""
    return search.trial_trainjob(obj, 0, first_assignment(obj))

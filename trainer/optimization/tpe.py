"""The TPE search (tree-structured Parzen estimators), run by optuna: trial i's values, given the
trials that finished before it was made.

optuna is a well-kept TPE, and it is imported here only, inside :func:`tpe_assignment`, and only
once a search has enough results for TPE to use: the operator's idle memory does not grow, and
``trainer render`` of a TrainJob does not pay for it.

Each call builds a fresh in-memory optuna study: every finished trial with a value is added as a
COMPLETE trial, every trial still running as a RUNNING one (optuna's constant liar keeps the next
proposal away from them), and the study is asked for one trial. Nothing is kept between calls, so
the answer depends on the arguments only: the sampler's seed is derived from the search's seed and
the trial's index, and the same (parameters, seed, index, history, pending) gives the same values.
A controller never asks twice for one trial anyway: a trial's values are written on its TrainJob
(the ``trainer.kubeflow.org/trial-parameters`` annotation) and read back from there.

Until :data:`STARTUP_TRIALS` trials have a value, TPE has nothing to model and optuna draws at
random; so do we, with :func:`trainer.optimization.search.random_assignment`: a TPE search starts
exactly as a random search with the same seed does (trial 0 is what admission's template check
builds), and optuna is not imported for it.

How the spaces map (docs/optimization.md, "The searches"): categorical to a CategoricalDistribution of its
choices; uniform and logUniform without a step to a Float- or IntDistribution over [min, max]
(``log`` for logUniform); a space with a step to an IntDistribution over its lattice's indexes
(point k is ``Numeric.point(k)``; a logUniform lattice's points each once, as a random search
draws them). Every value is written as random and grid write it (``Numeric.text``): never out of
its bounds.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from trainer.optimization.search import Assignment, Parameters, random_assignment
from trainer.optimization.spaces import Numeric, numeric, space_of

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

# optuna's own default (TPESampler's n_startup_trials): fewer results than this, and it samples at
# random.
STARTUP_TRIALS = 10

Finished = tuple[Assignment, float | None]
"""A finished trial as TPE sees it: its values, and its objective's value (None: it failed)."""


def tpe_assignment(
    parameters: Parameters,
    seed: int,
    index: int,
    history: Sequence[Finished],
    *,
    direction: str,
    pending: Sequence[Assignment] = (),
) -> Assignment:
    """Trial ``index``'s values in a TPE search.

    ``history`` is the finished trials, in index order, each as (assignment, objective value or
    None); a failed trial (None, or NaN, or an infinite value) tells TPE nothing and is left out.
    ``pending`` is the assignments of the trials still running. ``direction`` is the objective's,
    ``Minimize`` or ``Maximize``. A trial whose assignment does not fit the parameters (a value
    outside its space, a parameter missing: an annotation edited by hand) is left out too.

    With fewer than :data:`STARTUP_TRIALS` values in ``history``, this is
    ``random_assignment(parameters, seed, index)``. Raises ValueError for a space admission
    refuses (an Int space without a whole number).
    """
    if direction not in ("Minimize", "Maximize"):
        raise ValueError(f"unknown objective direction {direction!r}")
    results = [(a, v) for a, v in history if v is not None and math.isfinite(v)]
    if len(results) < STARTUP_TRIALS:
        return random_assignment(parameters, seed, index)
    axes = [_axis(p) for p in parameters]

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {axis.name: axis.distribution for axis in axes}
    with warnings.catch_warnings():
        # optuna warns of experimental and deprecated features; the operator's log is not the
        # place, and none of them changes what is proposed.
        warnings.simplefilter("ignore")
        study = optuna.create_study(
            direction="minimize" if direction == "Minimize" else "maximize",
            # optuna 5's defaults, said here so that they hold whatever a later release makes them:
            # one model of all the parameters together, and the trials running counted as poor.
            sampler=optuna.samplers.TPESampler(
                seed=sampler_seed(seed, index), multivariate=True, constant_liar=True
            ),
        )
        for assignment, value in results:
            params = _internal(axes, assignment)
            if params is not None:
                study.add_trial(
                    optuna.trial.create_trial(params=params, distributions=distributions, value=value)
                )
        for assignment in pending:
            params = _internal(axes, assignment)
            if params is not None:
                study.add_trial(
                    optuna.trial.create_trial(
                        state=optuna.trial.TrialState.RUNNING, params=params, distributions=distributions
                    )
                )
        proposed = study.ask(distributions).params
    return {axis.name: axis.external(proposed[axis.name]) for axis in axes}


def sampler_seed(seed: int, index: int) -> int:
    """The seed of trial ``index``'s sampler: from the search's seed and the index, as a random
    search's generator is, so two trials made together in one wave propose different values.
    32 bits: numpy's generator takes no more."""
    return int.from_bytes(hashlib.sha256(f"tpe:{seed}:{index}".encode()).digest()[:4], "big")


# --- the spaces ---


@dataclass(frozen=True)
class _Axis:
    """One parameter as optuna sees it, and the way between its values and ours."""

    name: str
    kind: str  # "categorical", "float", "int" (no step), "lattice", "points" (a logUniform lattice)
    distribution: BaseDistribution
    space: Numeric | None = None
    choices: tuple[str, ...] = ()  # categorical choices, or a logUniform lattice's points as text

    def external(self, value: Any) -> str:
        """optuna's value as the trial gets it."""
        if self.kind == "categorical":
            return str(value)
        if self.kind == "points":
            return self.choices[int(value)]
        assert self.space is not None
        if self.kind == "lattice":
            return self.space.text(self.space.point(int(value)))
        if self.kind == "int":
            return str(self.space.clip_int(int(value)))
        low, high = float(self.space.low), float(self.space.high)
        return self.space.text(min(max(float(value), low), high))

    def internal(self, text: str) -> Any | None:
        """A trial's value as optuna takes it, or None if it is not one of this space's."""
        if self.kind == "categorical":
            return text if text in self.choices else None
        if self.kind == "points":
            return self.choices.index(text) if text in self.choices else None
        number = _decimal(text)
        if number is None:
            return None
        assert self.space is not None
        if self.kind == "lattice":
            return self._lattice_index(text, number)
        if self.kind == "int":
            whole = number == number.to_integral_value()
            inside = self.space.int_low <= number <= self.space.int_high
            return int(number) if whole and inside else None
        value = float(number)
        return value if float(self.space.low) <= value <= float(self.space.high) else None

    def _lattice_index(self, text: str, number: Decimal) -> int | None:
        """The k whose point is written ``text``: found from the arithmetic, then checked."""
        assert self.space is not None and self.space.step is not None
        start = Decimal(self.space.int_low) if self.space.is_int else self.space.low
        k = int(((number - start) / self.space.step).to_integral_value())
        if 0 <= k < self.space.lattice_size() and self.space.text(self.space.point(k)) == text:
            return k
        return None


def _decimal(text: str) -> Decimal | None:
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _axis(parameter: Mapping[str, Any]) -> _Axis:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    name = str(parameter["name"])
    kind, space = space_of(parameter)
    if kind == "categorical":
        choices = tuple(str(choice) for choice in space["choices"])
        return _Axis(name, "categorical", CategoricalDistribution(choices), choices=choices)
    space_ = numeric(space, kind)
    if space_.is_int and space_.int_low > space_.int_high:
        raise ValueError(f"parameter {name!r}: no whole number lies between min and max")
    if space_.step is not None:
        if space_.log:
            points = tuple(dict.fromkeys(space_.text(value) for value in space_.lattice()))
            return _Axis(name, "points", IntDistribution(0, len(points) - 1), space_, points)
        return _Axis(name, "lattice", IntDistribution(0, space_.lattice_size() - 1), space_)
    if space_.is_int:
        return _Axis(name, "int", IntDistribution(space_.int_low, space_.int_high, log=space_.log), space_)
    distribution = FloatDistribution(float(space_.low), float(space_.high), log=space_.log)
    return _Axis(name, "float", distribution, space_)


def _internal(axes: Sequence[_Axis], assignment: Assignment) -> dict[str, Any] | None:
    """A trial's assignment as optuna's params, or None if any value does not fit its space."""
    params: dict[str, Any] = {}
    for axis in axes:
        text = assignment.get(axis.name)
        value = None if text is None else axis.internal(text)
        if value is None:
            return None
        params[axis.name] = value
    return params

"""OptimizationJob: a hyperparameter search over TrainJobs (trainer.kubeflow.org/v1alpha1).

Upstream's types (pkg/apis/trainer/v1alpha1/optimizationjob_types.go) are the contract: every
field, default, bound and CEL rule of theirs is here, in their words where users will search for
them. What we add is marked ``# Ours (docs/optimization.md)`` and said there.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from trainer.api.schema import APIModel, Rule, Schema
from trainer.api.trainjob import Condition, TemplateMetadata, TrainJobSpec

# A number written as a string, so that "0.1" reaches the training code as written and not as the
# float nearest to it; CEL reads it with double().
DOUBLE_PATTERN = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
Double = Annotated[str, Schema(min_length=1, max_length=64, pattern=DOUBLE_PATTERN)]

PARAMETER_TYPES = ("Int", "Float")
DIRECTIONS = ("Maximize", "Minimize")

MIN_BELOW_MAX = Rule("double(self.min) < double(self.max)", "min must be strictly less than max")
MIN_POSITIVE = Rule("double(self.min) > 0.0", "min must be strictly greater than 0")
# Ours (docs/optimization.md): a step makes a numeric space a lattice a grid can enumerate.
UNIFORM_STEP_POSITIVE = Rule(
    "!has(self.step) || double(self.step) > 0.0", "step must be strictly greater than 0"
)
UNIFORM_INT_STEP_WHOLE = Rule(
    "!has(self.step) || !has(self.type) || self.type != 'Int' || self.step.matches('^[0-9]+$')",
    "step must be a whole number (digits only) when type is Int",
)
LOG_STEP_ABOVE_ONE = Rule(
    "!has(self.step) || double(self.step) > 1.0",
    "step must be strictly greater than 1: on a logUniform space it is a factor",
)
ONE_SPACE = Rule(
    "[has(self.uniform),has(self.logUniform),has(self.categorical)].filter(x,x==true).size() == 1",
    "exactly one of the fields in [uniform logUniform categorical] must be set",
)
# Upstream's rule names random and grid; ours counts tpe too, in the same words.
ONE_ALGORITHM = Rule(
    "[has(self.random),has(self.grid),has(self.tpe)].filter(x,x==true).size() == 1",
    "exactly one of the fields in [random grid tpe] must be set",
)
TEMPLATE_METADATA = Rule(
    "!has(self.name) && !has(self.namespace)", "name and namespace cannot be set in a template."
)
SPEC_IMMUTABLE = Rule(
    "self == oldSelf", "OptimizationJobSpec is immutable and cannot be updated after creation"
)
PARALLEL_WITHIN_TRIALS = Rule(
    "self.parallelTrials <= self.numTrials", "parallelTrials cannot exceed numTrials"
)
# Ours (docs/optimization.md), as parallelTrials' rule is: a bound numTrials never reaches is a typo.
MAX_FAILED_WITHIN_TRIALS = Rule(
    "!has(self.maxFailedTrials) || self.maxFailedTrials <= self.numTrials",
    "maxFailedTrials cannot exceed numTrials",
)
# Ours (docs/optimization.md): upstream's grid takes categorical parameters only; a numeric one
# with a step is a finite lattice, so a grid can enumerate it too.
GRID_ENUMERABLE = Rule(
    "!has(self.searchAlgorithm.grid) || self.parameters.all(p, has(p.searchSpace.categorical)"
    " || (has(p.searchSpace.uniform) && has(p.searchSpace.uniform.step))"
    " || (has(p.searchSpace.logUniform) && has(p.searchSpace.logUniform.step)))",
    "Grid search requires every parameter to be Categorical or to have a step",
)


class Objective(APIModel):
    """The metric a trial reports (status.trainerStatus.metrics) and which way is better."""

    metric: Annotated[str, Schema(min_length=1, max_length=64)]
    direction: Annotated[str, Schema(default="Minimize", enum=DIRECTIONS)] = "Minimize"


class RandomAlgorithm(APIModel):
    """Independent samples; the seed makes a search repeatable (and a restart reproduce a trial)."""

    seed: Annotated[int | None, Schema(format="int64")] = None


class GridAlgorithm(APIModel):
    """Every combination of the parameters' values, in a fixed order, until numTrials or the end."""


# Ours (docs/optimization.md): Bayesian search (tree-structured Parzen estimators), run by optuna
# (trainer/optimization/tpe.py); upstream defers it to its phase 2.
class TPEAlgorithm(APIModel):
    """Samples guided by the results of the trials before; the seed makes it repeatable."""

    seed: Annotated[int | None, Schema(format="int64")] = None


class SearchAlgorithm(APIModel):
    random: RandomAlgorithm | None = None
    grid: GridAlgorithm | None = None
    tpe: TPEAlgorithm | None = None  # Ours (docs/optimization.md): see TPEAlgorithm


class NumericSpace(APIModel):
    """Numbers between min and max (both included), as strings so they reach the trial as written."""

    min: Double
    max: Double
    type: Annotated[str, Schema(default="Float", enum=PARAMETER_TYPES)] = "Float"
    # Ours (docs/optimization.md): the space is the lattice the step spans from min, so a grid can
    # enumerate it (and a random search samples its points).
    step: Double | None = None


class UniformSpace(NumericSpace):
    """Evenly spread over [min, max]; a step adds: min, min+step, ... up to max."""


class LogUniformSpace(NumericSpace):
    """Evenly spread over the logarithms of [min, max]; a step multiplies: min, min*step, ... up to max."""


class CategoricalSpace(APIModel):
    choices: Annotated[
        list[Annotated[str, Schema(max_length=64)]], Schema(min_items=1, max_items=100, list_type="set")
    ]


class SearchSpace(APIModel):
    uniform: Annotated[
        UniformSpace | None, Schema(rules=(MIN_BELOW_MAX, UNIFORM_STEP_POSITIVE, UNIFORM_INT_STEP_WHOLE))
    ] = None
    log_uniform: Annotated[
        LogUniformSpace | None, Schema(rules=(MIN_POSITIVE, MIN_BELOW_MAX, LOG_STEP_ABOVE_ONE))
    ] = Field(None, alias="logUniform")
    categorical: CategoricalSpace | None = None


class Parameter(APIModel):
    """One hyperparameter: its name (the trial's env var is made from it) and where it ranges."""

    name: Annotated[str, Schema(min_length=1, max_length=64)]
    search_space: Annotated[SearchSpace, Schema(rules=(ONE_SPACE,))] = Field(alias="searchSpace")


class TrainJobTemplate(APIModel):
    """The TrainJob every trial is made from; the trial's name and namespace are the controller's."""

    metadata: Annotated[TemplateMetadata | None, Schema(rules=(TEMPLATE_METADATA,))] = None
    spec: TrainJobSpec


class OptimizationJobSpec(APIModel):
    objectives: Annotated[
        list[Objective], Schema(min_items=1, max_items=1, list_type="map", map_keys=("metric",))
    ]
    search_algorithm: Annotated[
        SearchAlgorithm | None, Schema(default={"random": {}}, rules=(ONE_ALGORITHM,))
    ] = Field(None, alias="searchAlgorithm")
    parameters: Annotated[
        list[Parameter], Schema(min_items=1, max_items=100, list_type="map", map_keys=("name",))
    ]
    num_trials: Annotated[int, Schema(default=1, format="int32", minimum=1, maximum=100)] = Field(
        1, alias="numTrials"
    )
    parallel_trials: Annotated[int, Schema(default=1, format="int32", minimum=1, maximum=100)] = Field(
        1, alias="parallelTrials"
    )
    # Ours (docs/optimization.md): a bound on failed trials; unset, only numTrials bounds them.
    max_failed_trials: Annotated[int | None, Schema(format="int32", minimum=0, maximum=100)] = Field(
        None, alias="maxFailedTrials"
    )
    train_job_template: TrainJobTemplate = Field(alias="trainJobTemplate")


SPEC_RULES = (SPEC_IMMUTABLE, PARALLEL_WITHIN_TRIALS, MAX_FAILED_WITHIN_TRIALS, GRID_ENUMERABLE)


# --- status ---


class ParameterAssignment(APIModel):
    name: Annotated[str, Schema(min_length=1, max_length=64)]
    value: Annotated[str, Schema(min_length=1, max_length=64)]


class Result(APIModel):
    """The best trial so far: its TrainJob and the values it was given."""

    train_job_name: Annotated[str, Schema(min_length=1, max_length=63)] = Field(alias="trainJobName")
    parameters: Annotated[
        list[ParameterAssignment] | None, Schema(max_items=100, list_type="map", map_keys=("name",))
    ] = None


TrialCount = Annotated[int | None, Schema(format="int32", minimum=0)]


# Ours (docs/optimization.md): how many trials are in each state, for `kubectl get` columns.
class TrialCounts(APIModel):
    """Trials by state: created is every trial TrainJob made so far, the others a part of them."""

    created: TrialCount = None
    running: TrialCount = None
    succeeded: TrialCount = None
    failed: TrialCount = None


class OptimizationJobStatus(APIModel):
    conditions: Annotated[
        list[Condition] | None, Schema(max_items=100, list_type="map", map_keys=("type",))
    ] = None
    result: Result | None = None
    trials: TrialCounts | None = None  # Ours (docs/optimization.md): see TrialCounts


class OptimizationJob(APIModel):
    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: Annotated[OptimizationJobSpec, Schema(rules=SPEC_RULES)]
    status: OptimizationJobStatus | None = None

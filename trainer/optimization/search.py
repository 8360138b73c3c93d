"""The search itself, as pure functions: which values each trial gets, what its TrainJob is, and
which trial is best. No I/O, no clock: the same OptimizationJob always gives the same trials, so a
controller that restarts mid-search makes trial i again exactly as it made it before.

Parameters are the ``spec.parameters`` list of an admitted OptimizationJob (CRD defaults applied),
as plain JSON; an assignment maps each parameter's name, in spec order, to its value as text
(:mod:`trainer.optimization.spaces` says how numbers are written). docs/optimization.md is the
user's account of all this.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from trainer.api import constants as c
from trainer.optimization.spaces import Numeric, numeric, space_of

Assignment = dict[str, str]
Parameters = Sequence[Mapping[str, Any]]

MAX_NAME_LENGTH = 63  # a TrainJob's name is a DNS-1035 label (trainer/api/trainjob.py NAME_RULES)
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_PLACEHOLDER = re.compile(r"\$\{trainer\.([^{}]+)\}")
_HASH_LENGTH = 8


def env_var_name(parameter_name: str) -> str:
    """The env var a parameter reaches the training code as: ``KUBEFLOW_TRAINER_OPT_`` and the name,
    ASCII letters upper-cased and every other character but digits and ``_`` turned into ``_``
    (``learning-rate`` gives ``KUBEFLOW_TRAINER_OPT_LEARNING_RATE``)."""
    return c.TRIAL_ENV_PREFIX + "".join(
        ch.upper() if "a" <= ch <= "z" else ch if ("A" <= ch <= "Z" or "0" <= ch <= "9" or ch == "_") else "_"
        for ch in parameter_name
    )


# --- grid ---


def grid(parameters: Parameters, limit: int | None = None) -> list[Assignment]:
    """The grid's combinations in order, the first ``limit`` of them (all when None).

    The order is nested loops over the parameters in spec order, the first outermost (it changes
    slowest, the last fastest, as ``itertools.product``): a categorical parameter's choices in
    their order, a numeric one's lattice ascending (min, then each step up to max). Combination
    i is the same whatever the limit, so trial i is ``grid(parameters, i + 1)[i]``. Lazy: a grid
    larger than any search could run (100 parameters of 100 choices) costs only what is taken.
    Raises ValueError for a parameter a grid cannot enumerate (the CRD refuses it).
    """
    return list(itertools.islice(iter_grid(parameters), limit))


def iter_grid(parameters: Parameters) -> Iterator[Assignment]:
    """The grid's combinations, lazily, in :func:`grid`'s order."""
    axes = [(str(p["name"]), _axis(p)) for p in parameters]
    return _combinations(axes, {})


def _combinations(
    axes: list[tuple[str, Callable[[], Iterable[str]]]], partial: Assignment
) -> Iterator[Assignment]:
    if not axes:
        yield dict(partial)
        return
    (name, values), rest = axes[0], axes[1:]
    for value in values():
        partial[name] = value
        yield from _combinations(rest, partial)
    partial.pop(name, None)


def _axis(parameter: Mapping[str, Any]) -> Callable[[], Iterable[str]]:
    """A parameter's values in grid order, made afresh each time an outer parameter moves on."""
    kind, space = space_of(parameter)
    if kind == "categorical":
        choices = [str(choice) for choice in space["choices"]]
        return lambda: iter(choices)
    space_ = _checked(parameter, numeric(space, kind))
    if space_.step is None:
        raise ValueError(f"parameter {parameter['name']!r}: a grid needs a categorical space or a step")
    return lambda: _distinct(space_.text(value) for value in space_.lattice())


def _distinct(texts: Iterable[str]) -> Iterator[str]:
    """Ascending values written alike (two points closer than 12 digits tell apart) count once."""
    last = None
    for text in texts:
        if text != last:
            yield text
        last = text


# --- random ---


def seed_from_uid(uid: str) -> int:
    """The seed of a search whose algorithm names none: from the OptimizationJob's uid, so a
    restarted controller draws the same values, and two OptimizationJobs draw different ones."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") >> 1  # an int64 >= 0


def seed_of(optimizationjob_obj: Mapping[str, Any]) -> int:
    """The seed the OptimizationJob's algorithm gives, else :func:`seed_from_uid` of its uid."""
    algorithm = optimizationjob_obj.get("spec", {}).get("searchAlgorithm") or {}
    for settings in algorithm.values():
        if isinstance(settings, Mapping) and settings.get("seed") is not None:
            return int(settings["seed"])
    meta = optimizationjob_obj.get("metadata") or {}
    return seed_from_uid(str(meta.get("uid") or ""))


def random_assignments(parameters: Parameters, seed: int, count: int, start: int = 0) -> list[Assignment]:
    """Trials ``start`` to ``start + count - 1`` of a random search: each drawn from a generator of
    its own, seeded from (seed, trial index), so trial i is the same however many were drawn
    before it and whichever were asked for together."""
    return [random_assignment(parameters, seed, index) for index in range(start, start + count)]


def random_assignment(parameters: Parameters, seed: int, index: int) -> Assignment:
    """Trial ``index`` of a random search: one draw per parameter, in spec order.

    Uniform draws evenly over [min, max]; logUniform evenly over the logarithms, so each decade
    gets its share; Int gives integers in [min, max] (a logUniform Int is drawn over the
    logarithms of [lo - 0.5, hi + 0.5] and rounded, so each end gets its full share); a space
    with a step draws one of its lattice points, each alike; categorical one of its choices.
    """
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    return {str(p["name"]): _draw(rng, p) for p in parameters}


def _draw(rng: random.Random, parameter: Mapping[str, Any]) -> str:
    kind, space = space_of(parameter)
    if kind == "categorical":
        return str(rng.choice(space["choices"]))
    space_ = _checked(parameter, numeric(space, kind))
    if space_.step is not None:
        if space_.log:
            # Its points, each once: the step's powers rounded (Int) or written (Float) can repeat.
            points = list(_distinct(space_.text(value) for value in space_.lattice()))
            return str(rng.choice(points))
        return space_.text(space_.point(rng.randrange(space_.lattice_size())))
    if space_.is_int:
        low, high = space_.int_low, space_.int_high
        if not space_.log:
            return str(rng.randint(low, high))
        drawn = math.exp(rng.uniform(math.log(low - 0.5), math.log(high + 0.5)))
        return str(space_.clip_int(math.floor(drawn + 0.5)))
    low_f, high_f = float(space_.low), float(space_.high)
    if space_.log:
        value = math.exp(rng.uniform(math.log(low_f), math.log(high_f)))
    else:
        value = rng.uniform(low_f, high_f)
    return space_.text(min(max(value, low_f), high_f))


def _checked(parameter: Mapping[str, Any], space: Numeric) -> Numeric:
    """The space, if it holds a value (admission refuses an Int space without a whole number)."""
    if space.is_int and space.int_low > space.int_high:
        raise ValueError(f"parameter {parameter['name']!r}: no whole number lies between min and max")
    return space


# --- trials ---


def trial_name(optimizationjob_name: str, index: int) -> str:
    """The name of trial ``index``'s TrainJob: ``<name>-trial-<index>``, always a DNS-1035 label of
    at most 63 characters, as a TrainJob's name must be.

    An OptimizationJob's name is a DNS subdomain (up to 253 characters, dots, a leading digit);
    when the plain form is not a valid label, the name is cut to fit, its characters other than
    ``a-z0-9-`` made ``-``, a leading non-letter dropped, and 8 hex digits of the name's SHA-256
    put before ``-trial-<index>``, so two long names sharing a prefix still differ.
    """
    if index < 0:
        raise ValueError(f"trial index {index} is negative")
    plain = f"{optimizationjob_name}-trial-{index}"
    if len(plain) <= MAX_NAME_LENGTH and _DNS1035.match(plain):
        return plain
    digest = hashlib.sha256(optimizationjob_name.encode()).hexdigest()[:_HASH_LENGTH]
    suffix = f"-{digest}-trial-{index}"
    room = MAX_NAME_LENGTH - len(suffix)
    if room < 1:
        raise ValueError(f"trial index {index} is too large for a TrainJob name")
    stem = re.sub(r"[^a-z0-9-]", "-", optimizationjob_name.lower())
    stem = re.sub(r"^[^a-z]+", "", stem)[:room].rstrip("-") or "t"
    return stem + suffix


def label_value(optimizationjob_name: str) -> str:
    """The OptimizationJob's name as a label value (at most 63 characters): the name itself, or
    for a longer name its first 54 characters and 8 hex digits of its SHA-256."""
    if len(optimizationjob_name) <= MAX_NAME_LENGTH:
        return optimizationjob_name
    digest = hashlib.sha256(optimizationjob_name.encode()).hexdigest()[:_HASH_LENGTH]
    stem = optimizationjob_name[: MAX_NAME_LENGTH - _HASH_LENGTH - 1].rstrip("-.")
    return f"{stem}-{digest}"


def trial_trainjob(
    optimizationjob_obj: Mapping[str, Any], index: int, assignment: Assignment
) -> dict[str, Any]:
    """The TrainJob of trial ``index``, given ``assignment``: the template's, named for the trial,
    in the OptimizationJob's namespace, owned by it (a controller reference, so deleting the
    OptimizationJob deletes its trials), labelled with it and the index, annotated with the
    assignment as JSON (sorted keys, no spaces), and with the parameters in its trainer's env
    and its ``${trainer.<name>}`` placeholders (docs/optimization.md)."""
    meta = optimizationjob_obj["metadata"]
    name = str(meta["name"])
    template = optimizationjob_obj["spec"]["trainJobTemplate"]
    template_meta = template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": trial_name(name, index),
        "namespace": meta.get("namespace") or "default",
        "labels": {
            **(template_meta.get("labels") or {}),
            c.OPTIMIZATIONJOB_NAME_LABEL: label_value(name),
            c.TRIAL_INDEX_LABEL: str(index),
        },
        "annotations": {
            **(template_meta.get("annotations") or {}),
            c.TRIAL_PARAMETERS_ANNOTATION: json.dumps(assignment, sort_keys=True, separators=(",", ":")),
        },
        "ownerReferences": [
            {
                "apiVersion": c.API_VERSION,
                "kind": c.OPTIMIZATIONJOB_KIND,
                "name": name,
                "uid": str(meta.get("uid") or ""),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("finalizers"):
        metadata["finalizers"] = list(template_meta["finalizers"])
    spec = copy.deepcopy(template["spec"])
    trainer = spec.get("trainer")
    if not isinstance(trainer, dict):
        trainer = spec["trainer"] = {}
    trainer["env"] = _with_parameters(trainer.get("env") or [], assignment)
    for key in ("command", "args"):
        if isinstance(trainer.get(key), list):
            trainer[key] = [substitute(item, assignment) for item in trainer[key]]
    return {"apiVersion": c.API_VERSION, "kind": c.TRAINJOB_KIND, "metadata": metadata, "spec": spec}


def _with_parameters(env: list[dict[str, Any]], assignment: Assignment) -> list[dict[str, Any]]:
    """The template's env with each parameter's var set: in its place if the template has one of
    that name (replaced whole, a valueFrom too), else appended in spec order."""
    out = list(env)
    where = {entry.get("name"): i for i, entry in enumerate(out)}
    for parameter, value in assignment.items():
        var = {"name": env_var_name(parameter), "value": value}
        if var["name"] in where:
            out[where[var["name"]]] = var
        else:
            where[var["name"]] = len(out)
            out.append(var)
    return out


def substitute(text: str, assignment: Assignment) -> str:
    """``text`` with each ``${trainer.<name>}`` naming a parameter replaced by its value; a
    placeholder naming no parameter is left as written."""
    return _PLACEHOLDER.sub(lambda found: assignment.get(found[1], found[0]), text)


# --- the result ---


def best(
    objective_direction: str, results: Iterable[tuple[str, Assignment, float | None]]
) -> tuple[str, Assignment] | None:
    """The trial with the best value, as (TrainJob name, assignment); None if no trial has one.

    ``results`` are (trial TrainJob name, assignment, objective value or None): a trial that has
    not reported the metric, or reported NaN, is passed over. On a tie the one listed first wins,
    so a caller listing trials by index keeps the earliest.
    """
    if objective_direction not in ("Minimize", "Maximize"):
        raise ValueError(f"unknown objective direction {objective_direction!r}")
    sign = 1.0 if objective_direction == "Minimize" else -1.0
    found: tuple[str, Assignment] | None = None
    best_score = math.inf
    for name, assignment, value in results:
        if value is None or math.isnan(value):
            continue
        if found is None or sign * value < best_score:
            found, best_score = (name, assignment), sign * value
    return found

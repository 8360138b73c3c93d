"""ObjectMeta's generic checks and the name rules behind them, in apimachinery's words.

The API server checks every object's name, namespace, labels and annotations the same way
whatever its schema says, and plugins check the names they derive by the same rules; kept apart
from schema validation because a caller may want a CRD's own rules instead (TrainJob's RFC 1035
name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainer.apimachinery import json_values
from trainer.apimachinery.errors import FORBIDDEN, INVALID, REQUIRED, TOO_LONG, FieldError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from typing import Any, Final

__all__ = ["dns1035_label", "dns1123_subdomain", "too_long", "validate_object_meta"]

_DNS1123_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN: Final = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE: Final = "(" + _QUALIFIED_NAME + ")?"
_MAX_ANNOTATIONS_BYTES: Final = 256 * 1024


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's RegexError wording, examples and all."""
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, re.ASCII) is not None


def dns1123_subdomain(value: str) -> list[str]:
    """What is wrong with ``value`` as a DNS-1123 subdomain, in Kubernetes' words."""
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if not _matches(_DNS1123_SUBDOMAIN, value):
        message = (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1123_SUBDOMAIN, "example.com"))
    return problems


def _dns1123_label(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_DNS1123_LABEL, value):
        message = (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1123_LABEL, "my-name", "123-abc"))
    return problems


def dns1035_label(value: str) -> list[str]:
    """What is wrong with ``value`` as a DNS-1035 label, in Kubernetes' words."""
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_DNS1035_LABEL, value):
        message = (
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1035_LABEL, "my-name", "abc-123"))
    return problems


def qualified_name(value: str) -> list[str]:
    message = (
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
        "alphanumeric character"
    )
    parts = value.split("/")
    problems = []
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems.extend("prefix part " + p for p in dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(message, _QUALIFIED_NAME, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if not _matches(_QUALIFIED_NAME, name):
        problems.append("name part " + _regex_error(message, _QUALIFIED_NAME, "MyName", "my.name", "123-abc"))
    return problems


def _label_value(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_LABEL_VALUE, value):
        message = (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return problems


# ---------------------------------------------------------------------------------------------
# ObjectMeta
# ---------------------------------------------------------------------------------------------


def validate_object_meta(
    meta: Any, *, path: str = "metadata", namespaced: bool | None = None, require_name: bool = False
) -> list[FieldError]:
    """The generic ObjectMeta checks the API server makes for a custom resource.

    A name, when present, must be a DNS subdomain of at most 253 characters (generateName the
    same, as a prefix); a namespace a DNS label; label keys and annotation keys qualified names,
    label values at most 63 characters of the label alphabet; annotations at most 256 KiB in all.
    ``require_name`` asks for a name or generateName; ``namespaced`` True requires a namespace and
    False forbids one (None checks only its form). Kept apart from ``validate`` because a CRD's
    own rules (TrainJob's RFC 1035 name) may be what a caller wants instead.
    """
    if not isinstance(meta, Mapping):
        kind = "null" if meta is None else json_values.KINDS.get(type(meta)) or json_values.odd_kind(meta)[0]
        return [FieldError(path, INVALID, f'{path} in body must be of type object: "{kind}"', kind)]
    errors: list[FieldError] = []

    def text_field(name: str) -> str | None:
        value = meta.get(name)
        if value is None or isinstance(value, str):
            return value
        kind = json_values.KINDS.get(type(value)) or json_values.odd_kind(value)[0]
        errors.append(
            FieldError(
                f"{path}.{name}", INVALID, f'{path}.{name} in body must be of type string: "{kind}"', kind
            )
        )
        return None

    generate_name = text_field("generateName")
    if generate_name:
        # A generated name gets a random suffix, so a trailing '-' is fine (apimachinery's mask).
        masked = (
            generate_name[:-2] + "a"
            if generate_name.endswith("-") and len(generate_name) > 1
            else generate_name
        )
        for problem in dns1123_subdomain(masked):
            errors.append(FieldError(f"{path}.generateName", INVALID, problem, generate_name))
    name = text_field("name")
    if name:
        for problem in dns1123_subdomain(name):
            errors.append(FieldError(f"{path}.name", INVALID, problem, name))
    elif require_name and not generate_name:
        errors.append(FieldError(f"{path}.name", REQUIRED, "name or generateName is required"))
    namespace = text_field("namespace")
    if namespace:
        if namespaced is False:
            errors.append(FieldError(f"{path}.namespace", FORBIDDEN, "not allowed on this type"))
        else:
            for problem in _dns1123_label(namespace):
                errors.append(FieldError(f"{path}.namespace", INVALID, problem, namespace))
    elif namespaced:
        errors.append(FieldError(f"{path}.namespace", REQUIRED))
    errors.extend(_string_map(meta.get("labels"), f"{path}.labels", labels=True))
    errors.extend(_string_map(meta.get("annotations"), f"{path}.annotations", labels=False))
    return errors


def _string_map(values: Any, path: str, *, labels: bool) -> list[FieldError]:
    if values is None:
        return []
    if not isinstance(values, Mapping):
        kind = json_values.KINDS.get(type(values)) or json_values.odd_kind(values)[0]
        return [FieldError(path, INVALID, f'{path} in body must be of type object: "{kind}"', kind)]
    errors: list[FieldError] = []
    size = 0
    for key, value in values.items():
        for problem in qualified_name(key if labels else key.lower()):
            errors.append(FieldError(path, INVALID, problem, key))
        if not isinstance(value, str):
            kind = (
                "null"
                if value is None
                else json_values.KINDS.get(type(value)) or json_values.odd_kind(value)[0]
            )
            detail = f'{path}.{key} in body must be of type string: "{kind}"'
            errors.append(FieldError(f"{path}[{key}]", INVALID, detail, kind))
            continue
        if labels:
            # ValidateLabels names the map, not the entry, for a bad value (as for a bad key).
            for problem in _label_value(value):
                errors.append(FieldError(path, INVALID, problem, value))
        size += len(key.encode()) + len(value.encode())
    if not labels and size > _MAX_ANNOTATIONS_BYTES:
        errors.append(FieldError(path, TOO_LONG, too_long(_MAX_ANNOTATIONS_BYTES)))
    return errors


def too_long(limit: int) -> str:
    """field.TooLong's words for a limit in bytes."""
    return f"may not be more than {limit} {'byte' if limit == 1 else 'bytes'}"

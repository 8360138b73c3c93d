"""API errors as the ``Status`` objects a real kube-apiserver answers with.

Clients branch on ``code`` and ``reason`` (kopf retries 409 and 5xx, kubectl prints ``message``),
so each helper reproduces the wording of the apiserver's ``k8s.io/apimachinery/pkg/api/errors``.
"""

from __future__ import annotations

from typing import Any

from trainer.apimachinery.errors import FieldError


class APIError(Exception):
    """A request refused with a Kubernetes ``Status``; raised anywhere in the request path."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(kind: str, group: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> APIError:
    return APIError(
        404, "NotFound", f'{qualified(resource, group)} "{name}" not found', _details(resource, group, name)
    )


def already_exists(resource: str, group: str, name: str) -> APIError:
    return APIError(
        409,
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        _details(resource, group, name),
    )


def conflict(resource: str, group: str, name: str, why: str | None = None) -> APIError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return APIError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        _details(resource, group, name),
    )


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:
    causes = []
    for err in errors:
        text = str(err)
        # The cause message is the error without its field prefix, as Kubernetes renders it.
        prefix = f"{err.path}: "
        causes.append(
            {
                "reason": _cause_reason(err.type),
                "message": text[len(prefix) :] if err.path and text.startswith(prefix) else text,
                "field": err.path,
            }
        )
    joined = "; ".join(str(e) for e in errors)
    if len(errors) > 1:
        joined = "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(kind, group, name)
    details["causes"] = causes
    return APIError(422, "Invalid", f'{kind}.{group or "core"} "{name}" is invalid: {joined}', details)


def _cause_reason(error_type: str) -> str:
    return {
        "Invalid value": "FieldValueInvalid",
        "Required value": "FieldValueRequired",
        "Unsupported value": "FieldValueNotSupported",
        "Forbidden": "FieldValueForbidden",
        "Duplicate value": "FieldValueDuplicate",
        "Too long": "FieldValueTooLong",
        "Too many": "FieldValueTooMany",
        "Not found": "FieldValueNotFound",
        "Internal error": "InternalError",
    }.get(error_type, "FieldValueInvalid")


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> APIError:
    return APIError(405, "MethodNotAllowed", message)


PATCH_MEDIA_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)


def unsupported_media_type(content_type: str, accepted: tuple[str, ...] = PATCH_MEDIA_TYPES) -> APIError:
    """A 415 listing the media types the endpoint takes (the real server's message), then what
    was sent."""
    return APIError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)} (got {content_type})",
    )


def forbidden(resource: str, group: str, name: str, why: str) -> APIError:
    return APIError(
        403,
        "Forbidden",
        f'{qualified(resource, group)} "{name}" is forbidden: {why}',
        _details(resource, group, name),
    )


def unauthorized() -> APIError:
    return APIError(401, "Unauthorized", "Unauthorized")


def internal(message: str) -> APIError:
    return APIError(500, "InternalError", f"Internal error occurred: {message}")


def too_many_requests(retry_after: int) -> APIError:
    return APIError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": retry_after},
        {"Retry-After": str(retry_after)},
    )


def gone(message: str) -> APIError:
    return APIError(410, "Expired", message)

"""The admission webhooks read the cache on the event loop, the only thread that changes it.

kopf runs a plain-function handler in a thread pool; the watch handlers change the cache on the
loop meanwhile, so a validator in a thread could read a dict in the middle of a change. The
requests here go through kopf's own admission entry point, as its webhook server calls it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import ephemera, references
from kopf._core.engines import admission
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.reactor.inventory import ResourceMemories

from trainer.admission import admit as admit_module
from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.config import Configuration
from trainer.controller.operator import Operator

TRAINJOB: Obj = {
    "apiVersion": f"{c.GROUP}/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "tj", "namespace": "default", "uid": "u-1"},
    "spec": {"runtimeRef": {"name": "torch-distributed"}},
}


async def _review(operator: Operator, obj: Obj, plural: str = "trainjobs") -> Any:
    settings = kopf.OperatorSettings()
    registry = operator.registry()
    insights = references.Insights()
    insights.webhook_resources.add(
        references.Resource(
            group=c.GROUP, version="v1alpha1", plural=plural, namespaced=plural != "clustertrainingruntimes"
        )
    )
    request = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r-1",
            "resource": {"group": c.GROUP, "version": "v1alpha1", "resource": plural},
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": obj,
        },
    }
    return await admission.serve_admission_request(
        request,  # type: ignore[arg-type]  # kopf's TypedDict of the same shape
        settings=settings,
        registry=registry,
        insights=insights,
        memories=ResourceMemories(),
        memobase=ephemera.AnyMemo(kopf.Memo()),
        indices=OperatorIndexers().indices,
    )


def test_the_webhooks_run_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = Operator(Configuration())
    threads: dict[str, int] = {}
    admit, default_object = admit_module.admit, admit_module.default_object

    def recording_admit(*args: Any, **kwargs: Any) -> Any:
        threads["validator"] = threading.get_ident()
        return admit(*args, **kwargs)

    def recording_default(*args: Any, **kwargs: Any) -> Any:
        threads["defaulter"] = threading.get_ident()
        return default_object(*args, **kwargs)

    monkeypatch.setattr(admit_module, "admit", recording_admit)
    monkeypatch.setattr(admit_module, "default_object", recording_default)

    async def main() -> Any:
        threads["loop"] = threading.get_ident()
        return await _review(operator, TRAINJOB)

    response = asyncio.run(main())
    assert set(threads) == {"loop", "validator", "defaulter"}, response
    assert threads["validator"] == threads["loop"], "the validator reads the cache off the loop"
    assert threads["defaulter"] == threads["loop"]
    # The review itself still works: the runtime is unknown to the empty cache, so it is refused.
    assert response["response"]["allowed"] is False, response
    assert "torch-distributed" in response["response"]["status"]["message"], response


def test_the_validator_leaves_the_schema_and_cel_to_the_api_server() -> None:
    """The API server checks the CRD schema and its CEL rules before it calls the validating
    webhook, so the webhook runs only its own rules (``Mode.WEBHOOK``): a field our schema copy
    does not know and a CEL violation pass it, while a rule of its own still refuses."""
    from importlib import resources

    import yaml

    operator = Operator(Configuration())
    runtime = yaml.safe_load(
        resources.files("trainer.runtimes").joinpath("torch_distributed.yaml").read_text()
    )
    operator.cache.observe(runtime)
    beyond_the_schema: Obj = {
        **TRAINJOB,
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            # CEL: numProcPerNode must be greater than or equal to 1; managedBy is an enum-like rule.
            "trainer": {"numProcPerNode": 0, "fieldOfAFutureVersion": True},
            "managedBy": "example.com/elsewhere",
        },
    }
    response = asyncio.run(_review(operator, beyond_the_schema))
    assert response["response"]["allowed"] is True, response

    reserved: Obj = {
        **TRAINJOB,
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"env": [{"name": "PET_NODE_RANK", "value": "0"}]},
        },
    }
    response = asyncio.run(_review(operator, reserved))
    assert response["response"]["allowed"] is False, response
    assert "PET_NODE_RANK" in response["response"]["status"]["message"], response


def test_a_refusal_is_logged_once_naming_the_object(caplog: pytest.LogCaptureFixture) -> None:
    """kopf's own line said only "Webhook 'validator.trainjob' failed permanently": ours names the
    object, its kind and uid, as fields too (docs/configuration.md, "Logs")."""
    operator = Operator(Configuration())
    refused: Obj = {**TRAINJOB, "spec": {"runtimeRef": {"name": "no-such-runtime"}}}
    with caplog.at_level(logging.INFO, logger="trainer.webhooks"):
        response = asyncio.run(_review(operator, refused))
    assert response["response"]["allowed"] is False
    (line,) = [r for r in caplog.records if r.name == "trainer.webhooks"]
    assert line.getMessage().startswith("refused TrainJob default/tj: ")
    assert "no-such-runtime" in line.getMessage()
    assert (line.__dict__["object_uid"], line.__dict__["object_reason"]) == ("u-1", "Refused")


def test_a_denial_with_several_errors_has_one_per_line(caplog: pytest.LogCaptureFixture) -> None:
    """The API server passes the message through after `admission webhook "<name>" denied the
    request: `, and kubectl prints it as it is: each error on its own line, as `trainer render`
    prints them, not one `[a, b]` line. The log keeps one line per refusal."""
    operator = Operator(Configuration())
    runtime: Obj = {
        "apiVersion": f"{c.GROUP}/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "rt", "uid": "u-2"},
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 2,
                            "template": {
                                "metadata": {"labels": {c.ANCESTOR_LABEL: "trainer"}},
                                "spec": {"template": {"spec": {"containers": [{"name": "trainer"}]}}},
                            },
                        }
                    ]
                }
            }
        },
    }
    with caplog.at_level(logging.INFO, logger="trainer.webhooks"):
        response = asyncio.run(_review(operator, runtime, "clustertrainingruntimes"))
    assert response["response"]["allowed"] is False, response
    job = "spec.template.spec.replicatedJobs[0]"
    assert response["response"]["status"]["message"].splitlines() == [
        f"{job}.replicas: Invalid value: 2: always must be 1",
        f'{job}.template.spec.template.spec.containers: Invalid value: ["trainer"]: must contain the '
        'required container for the ancestor: trainer, a container named "node"',
    ]
    (line,) = [r for r in caplog.records if r.name == "trainer.webhooks"]
    assert "\n" not in line.getMessage() and "always must be 1; spec.template" in line.getMessage()


def test_the_rules_not_checked_error_would_be_a_plain_last_line() -> None:
    """The webhook never sees it (the API server refuses such an object before calling it), but
    were admission to return it, the denial would say it once, in plain words, not as `<nil>`."""
    from trainer.apimachinery.errors import (
        INVALID,
        RULES_NOT_CHECKED,
        RULES_NOT_CHECKED_NOTE,
        AdmissionError,
        FieldError,
        required,
    )
    from trainer.controller.webhooks import _admission_message

    refused = AdmissionError(
        [required("spec.runtimeRef.name"), FieldError("<nil>", INVALID, RULES_NOT_CHECKED, None)]
    )
    assert _admission_message(refused) == f"spec.runtimeRef.name: Required value\n{RULES_NOT_CHECKED_NOTE}"

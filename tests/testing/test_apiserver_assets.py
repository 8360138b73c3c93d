"""The generated assets the server ships: Kubernetes schemas and description-stripped CRDs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from trainer_sandbox import gen_crds, gen_k8s_schemas

REFERENCE_CRDS = Path("/work/shared/reference/crds")


def test_k8s_schemas_are_current() -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes_validate is not installed")
    committed = json.loads(gzip.decompress(gen_k8s_schemas.OUTPUT.read_bytes()))
    assert committed == gen_k8s_schemas.build(), "run: python -m trainer_sandbox.gen_k8s_schemas"


def test_k8s_schemas_cover_every_served_builtin_kind() -> None:
    from trainer_sandbox.apiserver.resources import builtin_types

    kinds = json.loads(gzip.decompress(gen_k8s_schemas.OUTPUT.read_bytes()))["kinds"]
    for rt in builtin_types():
        assert f"{rt.api_version}/{rt.kind}" in kinds


@pytest.mark.skipif(not REFERENCE_CRDS.is_dir(), reason="reference CRDs not available")
def test_bundled_crds_are_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen_crds, "TARGET", tmp_path)
    gen_crds.main([str(REFERENCE_CRDS)])
    bundled = Path(gen_crds.__file__).with_name("crds")
    for fresh in tmp_path.glob("*.json"):
        assert json.loads(fresh.read_text()) == json.loads((bundled / fresh.name).read_text()), fresh.name


def test_strip_descriptions_keeps_fields_named_description() -> None:
    schema = {"description": "x", "properties": {"description": {"type": "string", "description": "y"}}}
    assert gen_crds.strip_descriptions(schema) == {"properties": {"description": {"type": "string"}}}

"""`trainer render` starts fast because of what it does not import; this holds that structurally.

`bench/render_cold_start.py` measures the start-up; this test fails when a change pulls a heavy
package into the render path, whatever the machine's speed. The API models are pydantic
models, the source of the CRDs; the render path reads admitted objects through the plain views
generated from them (``trainer.api.views``), so neither the models nor pydantic are on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from render_helpers import ROOT

TRAINJOB = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: cold-start
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: 2
"""

# Packages and modules `trainer render` has no use for: the operator's stack, the API models and
# pydantic, the CRD and view generators, the stand-in, validators used only by tests.
NOT_ON_THE_RENDER_PATH = (
    "pydantic",
    "trainer.api.runtime",
    "trainer.api.trainjob",
    "trainer.api.schema",
    "trainer.api.viewgen",
    "kopf",
    "kubernetes",
    "aiohttp",
    "jinja2",
    "cryptography",
    "prometheus_client",
    "celpy",
    "jsonschema",
    "trainer.controller",
    "trainer.api.crdgen",
    "trainer_sandbox",
)

PROBE = """\
import json, sys
from trainer.cli import main
code = main(["render", "-f", sys.argv[1]])
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_render_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(TRAINJOB)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0 and "kind: JobSet" in done.stdout
    loaded = [m for m in report["modules"] for p in NOT_ON_THE_RENDER_PATH if m == p or m.startswith(p + ".")]
    assert not loaded, f"trainer render loaded {loaded}"
    # What it reads admitted objects through: the plain typed views.
    assert "trainer.api.views" in report["modules"]

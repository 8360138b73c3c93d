"""The chart tests import the chart's tools (charts/tools) and their own harness (chart_harness)."""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
for _path in (_ROOT / "charts" / "tools", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

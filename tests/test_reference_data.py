"""tests/reference_data.py: where the upstream reference data is, and what happens without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import reference_data


def test_the_environment_variable_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(reference_data.ENV_VAR, str(tmp_path))
    assert reference_data.reference_dir() == tmp_path
    monkeypatch.delenv(reference_data.ENV_VAR)
    assert reference_data.reference_dir() == reference_data.DEFAULT


def test_missing_data_skips_outside_ci_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(reference_data.ENV_VAR, str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    (tmp_path / "crds").mkdir()
    assert reference_data.require("crds") == tmp_path
    with pytest.raises(pytest.skip.Exception) as skipped:
        reference_data.require("crds", "runtimes")
    assert str(tmp_path / "runtimes") in str(skipped.value)
    assert reference_data.MISSING in str(skipped.value)
    assert reference_data.ENV_VAR in str(skipped.value)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_data_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str) -> None:
    monkeypatch.setenv(reference_data.ENV_VAR, str(tmp_path / "absent"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        reference_data.require()
    assert str(tmp_path / "absent") in str(failed.value)


@pytest.mark.parametrize("ci", ["", "0", "false"])
def test_ci_off_values(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    assert not reference_data.in_ci()


def test_parameters_stand_in_for_missing_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(reference_data.ENV_VAR, str(tmp_path / "absent"))
    (placeholder,) = reference_data.params([], arity=2)
    assert placeholder.id == "no-reference-data"
    assert placeholder.values == (None, None)
    assert [m.name for m in placeholder.marks] == [reference_data.MARKER]
    assert reference_data.params(["a"]) == ["a"]

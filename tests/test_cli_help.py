"""`trainer --help` and each subcommand's: every option says what it does and what it accepts, so
that an operator never has to read the code (or guess from `choices`) to fill in a flag."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from render_helpers import trainjob

from trainer.cli import _build_parser, main

# Their options are the trainer-sandbox package's (trainer/cli.py passes their arguments through).
PASSED_THROUGH = {"demo", "sandbox"}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings]


def help_of(command: str, flag: str) -> str:
    """The help text of ``flag`` as ``--help`` prints it (``%(default)s`` filled in)."""
    parser = subcommands()[command]
    (action,) = (a for a in options(parser) if flag in a.option_strings)
    formatter = parser._get_formatter()
    return " ".join(formatter._expand_help(action).split())


def test_every_subcommand_and_every_option_has_help() -> None:
    parser = _build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest for c in sub._choices_actions} == set(sub.choices)
    assert all(c.help and c.help.strip() for c in sub._choices_actions)
    assert all(a.help and a.help.strip() for a in options(parser))
    missing = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, command in subcommands().items()
        if name not in PASSED_THROUGH
        for action in options(command)
        if not (action.help and len(action.help.split()) >= 3)
    ]
    assert missing == []


@pytest.mark.parametrize("command", ["render", "migrate"])
def test_output_help_names_every_format_it_accepts(command: str) -> None:
    (action,) = (a for a in options(subcommands()[command]) if "-o" in a.option_strings)
    text = help_of(command, "-o")
    assert action.choices is not None
    for choice in action.choices:
        assert f"{choice}:" in text, text
    assert "(default: yaml)" in text


def test_now_help_gives_the_format_and_examples_render_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each example in the help of ``--now`` is a time ``trainer render`` takes, and becomes the
    TrainJob's timestamps: an example that drifted from what the parser takes fails here."""
    text = help_of("render", "--now")
    assert "RFC 3339" in text and "YYYY-MM-DDTHH:MM:SS" in text
    examples = re.findall(r"\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:\d{2})", text)
    assert "2026-01-01T00:00:00Z" in examples and len(examples) >= 3  # two examples and the default
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob(runtime_name="torch-distributed")))
    for example in examples:
        assert main(["render", "-f", str(path), "--now", example]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"creationTimestamp: '{example}'" in out, out[:400]
    assert main(["render", "-f", str(path), "--now", "2026-01-01 00:00:00"]) == 2
    assert "not an RFC 3339 time such as 2026-01-01T00:00:00Z" in capsys.readouterr().err


def test_run_log_format_and_verbosity_say_what_they_log() -> None:
    log_format = help_of("run", "--log-format")
    assert "plain:" in log_format and "json:" in log_format and "(default: plain)" in log_format
    for field in ("time", "level", "logger", "message", "kind", "namespace", "name", "uid", "reason"):
        assert field in log_format
    verbose = help_of("run", "-v")
    # The three levels of docs/configuration.md, "Logs" (and of configure_logging).
    assert "Without it:" in verbose and "-v:" in verbose and "-vv:" in verbose


def test_standalone_help_says_it_does_nothing_and_it_does_nothing() -> None:
    """kopf always runs without peering here (controller/operator.py): the flag is parsed and its
    help must not promise anything else."""
    text = help_of("run", "--standalone")
    assert "no effect" in text and "always the case" not in text
    source = Path(__file__).parents[1] / "trainer" / "controller"
    assert "args.standalone" not in (source / "main.py").read_text()
    assert "standalone=True" in (source / "operator.py").read_text()


@pytest.mark.parametrize("command", [[], *([name] for name in ("render", "migrate", "crds", "run"))])
def test_help_exits_0(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert "usage: trainer" in capsys.readouterr().out

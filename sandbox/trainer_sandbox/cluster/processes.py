"""Background processes that outlive ``up`` and can be found and stopped by ``down``.

Each component runs in a session of its own (so a terminal's Ctrl-C or the exit of ``up`` does not
reach it) with stdout and stderr in ``logs/<component>.log``. Pids alone are not enough to find
them again: a pid may be reused once a process is gone, so each record also carries the binary,
and a pid is only signalled while ``/proc/<pid>/cmdline`` still starts with that binary.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    """What ``down`` needs to find one process again."""

    name: str
    pid: int
    binary: str


def launch(
    name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached from our session, its output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )


def is_ours(record: Record) -> bool:
    """Whether ``record.pid`` is still the process we started (and not a zombie or a stranger)."""
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{record.pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0:1]
    if state == ["Z"]:
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == record.binary


def _signal(record: Record, sig: signal.Signals) -> None:
    if not is_ours(record):
        return
    # The component leads its own process group (start_new_session): signal the group, so anything
    # it may have spawned goes with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)


def stop(
    waves: Sequence[Sequence[Record]],
    grace: float = 10.0,
    children: Iterable[subprocess.Popen[bytes]] = (),
) -> list[str]:
    """Stop the processes wave by wave: SIGTERM a wave, SIGKILL what is left of it after ``grace``
    seconds, then the next wave. Returns the names that needed SIGKILL. ``children`` are the
    Popen objects of this process, reaped so none is left a zombie.

    Waves exist because kube-apiserver drains its clients' connections before it exits: stopped
    after its clients it takes a second, stopped with them it can take fifteen.
    """
    popens = list(children)
    killed: list[str] = []
    for wave in waves:
        for r in wave:
            _signal(r, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_running(r, popens) for r in wave):
            time.sleep(0.02)
        left = [r for r in wave if _running(r, popens)]
        for r in left:
            _signal(r, signal.SIGKILL)
            killed.append(r.name)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_running(r, popens) for r in left):
            time.sleep(0.02)
    return killed


def _running(record: Record, popens: list[subprocess.Popen[bytes]]) -> bool:
    for p in popens:
        if p.pid == record.pid:
            p.poll()  # reap our own child, so it stops counting as running
    return is_ours(record)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log, for naming what went wrong."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(data.splitlines()[-lines:])


def save_records(path: Path, records: Sequence[Record], extra: Mapping[str, object]) -> None:
    """Write the records atomically: ``down`` may read while ``up`` is still adding to them."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**extra, "processes": [asdict(r) for r in records]}, indent=2) + "\n")
    tmp.replace(path)


def load_records(path: Path) -> tuple[list[Record], dict[str, object]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return [], {}
    records = [Record(**r) for r in data.pop("processes", [])]
    return records, data

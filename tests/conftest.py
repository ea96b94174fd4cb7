"""Shared pytest configuration."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.model_fixtures"]


def _java_children() -> set[int]:
    """PIDs of live `java` processes whose parent is this (pytest) process."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if name == "java" and state != "Z" and int(ppid) == os.getpid():
            pids.add(int(entry))
    return pids


@pytest.fixture(scope="session", autouse=True)
def no_stray_java_processes():
    """Fail the session if a test leaves a JVM (e.g. ScienceWorld's) running."""
    before = _java_children()
    yield
    import gc

    gc.collect()
    stray = _java_children() - before
    for pid in stray:  # do not leave them behind on the shared machine
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not stray, f"tests left java processes running: {sorted(stray)}"

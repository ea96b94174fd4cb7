"""Helpers for tests that kill a training process: the JVMs it leaves behind."""

from __future__ import annotations

import os
import signal
import time

from empo2.envs.jvm import running_jvm_pids


def reap_jvms_of(pid: int) -> list[int]:
    """The JVMs that process `pid` (now dead) started and that were still running 30 s after it died: killed, so
    none is left on a shared machine even when the test fails, and returned for the test to assert on."""
    left = running_jvm_pids(pid)
    for _ in range(300):  # the JVMs (py4j's die_on_exit) stop when their stdin closes with the process
        if not left:
            break
        time.sleep(0.1)
        left = running_jvm_pids(pid)
    for jvm in left:
        os.kill(jvm, signal.SIGKILL)
    return left

"""The JVM plumbing shared by the environments that run in Java behind py4j (ScienceWorld, TextWorldExpress).

Long RL runs start thousands of episodes, so a simulator here

* runs with JVM options its Python class cannot pass (a heap cap, an owner tag): both packages start
  their JVM through py4j's `launch_gateway`, a global of their module, which `use_launch_options`
  replaces once by a pass-through that appends the options the calling thread asked for;
* starts, loads and steps under a time limit (`launch`, `JvmOwner._call`); a timeout or a dead JVM
  (py4j network error) kills the JVM, and `JvmOwner` starts a fresh one (`_restart`);
* leaves no process behind: every JVM carries `-Dempo2.jvm.owner=<pid>.<n>`, so the ones this Python
  process started can be found by command line (`running_jvm_pids`), also before py4j hands back the
  handle; `close()` stops it, idempotently, also from `__del__` and at interpreter exit.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import re
import signal
import subprocess
import threading
import time
import weakref
from typing import Any, Callable

from py4j.java_gateway import launch_gateway as _py4j_launch_gateway
from py4j.protocol import Py4JError

from empo2.envs.base import StepResult, jaccard, snap_action, words

logger = logging.getLogger(__name__)

RESTART_ATTEMPTS = 3


class SimulatorError(RuntimeError):
    """The simulator failed in a way a restart is meant to fix (dead JVM, timeout)."""


class SimulatorTimeout(SimulatorError, TimeoutError):
    """A simulator call ran past its time limit."""


CALL_FAILED = (Py4JError, SimulatorError)
"""The errors of a call to a running simulator after which a fresh JVM is started."""
START_FAILED = (*CALL_FAILED, OSError)
"""The errors of a JVM start after which it is tried again."""


# Options for the JVM launched by the current thread. A thread-local, not a temporary swap of the
# module global, so that simulators may be started from several threads at once; callers that set
# no options (in their thread) get py4j's behaviour unchanged.
_launch_opts = threading.local()


def _launch_gateway_with_options(*args, **kwargs):
    extra = getattr(_launch_opts, "javaopts", None)
    if not extra:
        return _py4j_launch_gateway(*args, **kwargs)
    kwargs["javaopts"] = list(kwargs.get("javaopts") or []) + list(extra)
    result = _py4j_launch_gateway(*args, **kwargs)
    _launch_opts.proc = result[1] if isinstance(result, tuple) else None
    return result


def use_launch_options(module) -> None:
    """Make `module`'s `launch_gateway` (imported from py4j) honour the options `launch` sets."""
    if getattr(module.launch_gateway, "__name__", "") != _launch_gateway_with_options.__name__:
        module.launch_gateway = _launch_gateway_with_options


_OWNER_PROPERTY = "-Dempo2.jvm.owner"
_launch_counter = itertools.count()


def _owner_token() -> str:
    return f"{_OWNER_PROPERTY}={os.getpid()}"


def _process_argvs():
    """(pid, argv as bytes) of every readable process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    yield int(entry), f.read().split(b"\0")
            except OSError:
                continue


def _pids_with_cmdline_arg(arg: str) -> list[int]:
    """Live processes that have `arg` as one of their command-line arguments."""
    needle = arg.encode()
    return [pid for pid, argv in _process_argvs() if needle in argv]


def running_jvm_pids(owner: int | None = None) -> list[int]:
    """PIDs of the live JVMs that process `owner` (default: this Python process) started through this module."""
    prefix = f"{_OWNER_PROPERTY}={os.getpid() if owner is None else owner}.".encode()
    return [pid for pid, argv in _process_argvs() if any(a.startswith(prefix) for a in argv)]


# py4j logs every failed connection attempt at ERROR level with a traceback. After one of our JVMs
# died (killed, crashed, timed out) py4j's proxies of Java objects still try to tell that JVM they
# were garbage-collected, which gives a dozen such tracebacks per restart. The owner handles and logs
# the event itself (WARNING "restarting the simulator"), so this filter demotes those records to
# DEBUG, and only for ports of JVMs this module started that are known to be dead.
_PORT_PROCS: "dict[int, subprocess.Popen]" = {}
_CONNECT_ERROR = re.compile(r"trying to connect to the Java server \([^:]*:(\d+)\)")


class _DeadJvmLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        match = _CONNECT_ERROR.search(record.getMessage())
        proc = _PORT_PROCS.get(int(match.group(1))) if match else None
        if proc is not None and proc.poll() is not None:
            logger.debug("py4j (JVM %d is dead): %s", proc.pid, record.getMessage())
            return False
        return True


logging.getLogger("py4j.java_gateway").addFilter(_DeadJvmLogFilter())


def _register_port(port: int, proc: subprocess.Popen) -> None:
    _PORT_PROCS[port] = proc
    try:
        while len(_PORT_PROCS) > 256:  # keep the table small; old ports are long dead
            _PORT_PROCS.pop(next(iter(_PORT_PROCS)))
    except (KeyError, RuntimeError, StopIteration):  # pragma: no cover - concurrent update
        pass


def _in_thread(fn: Callable[[], Any], what: str) -> tuple[threading.Thread, dict]:
    """Start `fn` in a daemon thread; its result or exception lands in the dict."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as error:  # handed to the caller
            box["error"] = error

    thread = threading.Thread(target=target, name=f"simulator {what}", daemon=True)
    thread.start()
    return thread, box


def run_with_timeout(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run `fn` in a daemon thread; raise SimulatorTimeout after `timeout` seconds.

    On timeout the thread is left running: the caller kills the JVM, which makes
    the pending py4j call fail and the thread end.
    """
    thread, box = _in_thread(fn, what)
    thread.join(timeout)
    if thread.is_alive():
        raise SimulatorTimeout(f"{what} took longer than {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _stop_process(proc: subprocess.Popen | None, force: bool = False) -> None:
    """Stop a JVM process and reap it: SIGTERM then SIGKILL, or SIGKILL at once."""
    if proc is None:
        return
    try:
        if proc.poll() is None:
            if force:
                proc.kill()
            else:
                proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired) as error:  # pragma: no cover - best effort
        logger.warning("could not stop JVM %s: %s", proc.pid, error)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:  # pragma: no cover
            pass


def shutdown(sim, proc: subprocess.Popen | None, force: bool = False) -> None:
    """Close a simulator's py4j gateway (client sockets, callback server) and stop its JVM."""
    if sim is not None:
        try:
            # Not `shutdown()`: that first opens a new connection to the JVM, which
            # may be dead. `close()` drops the connections and the callback server.
            sim._gateway.close()
            # Marked disconnected, later calls (and the finalizers of py4j's Java
            # object proxies) fail fast instead of retrying a dead port and logging.
            sim._gateway._gateway_client.is_connected = False
        except Exception as error:  # pragma: no cover - best effort
            logger.debug("closing the py4j gateway failed: %s", error)
    _stop_process(proc, force=force)


def launch(construct: Callable[[], Any], javaopts: list[str], timeout: float, name: str) -> tuple[Any, subprocess.Popen]:
    """Build a simulator (`construct()`, which starts its JVM through a patched `launch_gateway`) with
    `javaopts` and the owner tag, within `timeout` s. Returns (simulator, its JVM process)."""
    token = f"{_owner_token()}.{next(_launch_counter)}"
    box: dict[str, Any] = {}

    def start():
        _launch_opts.javaopts = [*javaopts, token]
        _launch_opts.proc = None
        try:
            sim = construct()
            box["sim"] = sim
            return sim, _launch_opts.proc
        finally:
            box["proc"] = _launch_opts.proc
            _launch_opts.javaopts = None
            _launch_opts.proc = None

    thread, thread_box = _in_thread(start, "JVM start")
    thread.join(timeout)
    timed_out = thread.is_alive()
    if timed_out or "error" in thread_box:
        # Kill whatever this launch started (found by its token, since py4j only
        # hands the process back once the JVM has printed its port), until the
        # start thread has given up; then report.
        deadline = time.monotonic() + 15
        while True:
            for pid in _pids_with_cmdline_arg(token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not thread.is_alive() or time.monotonic() > deadline:
                break
            thread.join(0.1)
        shutdown(box.get("sim"), box.get("proc"), force=True)
        if not timed_out:
            raise SimulatorError(f"{name} JVM failed to start: {thread_box['error']!r}") from thread_box["error"]
        raise SimulatorTimeout(f"{name} JVM start took longer than {timeout:g} s")
    sim, proc = thread_box["value"]
    if proc is None:  # pragma: no cover - py4j or the package changed under us
        shutdown(sim, None)
        raise SimulatorError(f"could not get hold of the {name} JVM process")
    _register_port(sim._gateway.gateway_parameters.port, proc)
    return sim, proc


_LIVE: "weakref.WeakSet[JvmOwner]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for env in list(_LIVE):
        env.close()


class JvmOwner:
    """An environment that owns one simulator JVM: time limits, restarts after errors, clean shutdown, and the
    parts of `reset` and `step` that do not depend on the game.

    A subclass implements `_start(variation, gold)`: start a JVM (`launch`, stored in `self._sim`,
    `self._proc`) and load `variation`, and `_reset_loaded(variation)`: reset the loaded game, set `_state`
    (with "valid_actions"), `_variation`, `_steps`, `_score`, `_episode_live`, and return (observation, info).
    Its constructor calls `_own(...)`, then `_open(...)` for the first start.
    """

    name = "simulator"

    def _own(self, name: str, load_timeout_s: float, step_timeout_s: float) -> None:
        """Set up the bookkeeping: `name` for messages, the time limits of a start and of a call."""
        self.name = name
        self.load_timeout_s = float(load_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self._variation = None
        self.restarts = 0
        self._sim = None
        self._proc: subprocess.Popen | None = None
        self._closed = False
        self._episode_live = False
        _LIVE.add(self)

    @property
    def jvm_pid(self) -> int | None:
        """PID of the current JVM (None once closed)."""
        return self._proc.pid if self._proc is not None else None

    def _kill_jvm(self, force: bool = True) -> None:
        """Drop the simulator and stop its JVM (SIGKILL unless `force=False`)."""
        sim, proc = self._sim, self._proc
        self._sim = self._proc = None
        shutdown(sim, proc, force=force)

    def _call(self, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        """Run one simulator call under a time limit; on timeout kill the JVM."""
        if self._sim is None:
            raise SimulatorError(f"{self.name} JVM is not running")
        try:
            return run_with_timeout(fn, timeout, f"{self.name} {what}")
        except SimulatorTimeout:
            self._kill_jvm()
            raise

    def _start(self, variation: int, gold: bool) -> None:
        raise NotImplementedError

    def _start_with_retries(self, variation: int, gold: bool, then: Callable[[], Any] | None = None) -> Any:
        """`_start` (then `then()`), up to RESTART_ATTEMPTS times; clear error if all fail."""
        last: BaseException | None = None
        for attempt in range(RESTART_ATTEMPTS):
            try:
                self._start(variation, gold)
                return then() if then is not None else None
            except START_FAILED as error:
                last = error
                logger.warning("%s: simulator start failed (attempt %d/%d): %r",
                               self.name, attempt + 1, RESTART_ATTEMPTS, error)
                self._kill_jvm()
        message = (
            f"{self.name}: the simulator could not be started and loaded "
            f"in {RESTART_ATTEMPTS} attempts (load_timeout_s={self.load_timeout_s:g}); "
            f"last error: {last!r}"
        )
        if isinstance(last, TimeoutError):
            raise TimeoutError(message) from last
        raise RuntimeError(message) from last

    def _open(self, variation, then: Callable[[], Any]) -> Any:
        """The first start (`_start_with_retries`), returning `then()`; a failure closes the environment first."""
        try:
            return self._start_with_retries(variation, gold=False, then=then)
        except BaseException:
            self.close()
            raise

    def _restart(self, variation: int, why: BaseException, gold: bool = False,
                 then: Callable[[], Any] | None = None) -> Any:
        """Replace the JVM after an error, load `variation`, run `then()`."""
        self.restarts += 1
        logger.warning("%s: restarting the simulator (%s: %s)", self.name, type(why).__name__, why)
        return self._start_with_retries(variation, gold, then)

    def _ensure_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: environment is closed")

    def _reset_or_restart(self, variation: int, reset: Callable[[], tuple[str, dict]]) -> tuple[str, dict]:
        """`reset()`; after a dead or hung JVM, a fresh one reset on `variation` (info["env_restarted"] True)."""
        self._episode_live = False
        try:
            return reset()
        except CALL_FAILED as error:
            observation, info = self._restart(variation, error, then=lambda: self._reset_loaded(variation))
            info["env_restarted"] = True
            return observation, info

    def _begin_step(self, text: str) -> tuple[str, dict]:
        """Check that an episode runs, snap `text` to an admissible action, count the step:
        (the action, the info every outcome of this step carries)."""
        self._ensure_open()
        if not self._episode_live:
            raise RuntimeError(f"{self.name}: no running episode; call reset(variation) first")
        action = snap_action(text, self._state["valid_actions"])
        exact = action.lower() == text.strip().lower()
        self._steps += 1
        return action, {"raw_action": text, "executed_action": action, "exact_match": exact,
                        "similarity": 1.0 if exact else jaccard(words(text), words(action)),
                        "step": self._steps, "variation": self._variation}

    def _restarted_step(self, step_info: dict, error: BaseException, **extra) -> StepResult:
        """The outcome of a step whose JVM died or hung: a fresh JVM is reset on the same variation, but this
        episode is over (the caller must `reset` before stepping again); its score stays what it was."""
        self._episode_live = False
        variation, score = self._variation, self._score
        info = {**step_info, **self._state, "score": score, **extra, "env_restarted": True,
                "env_error": f"{type(error).__name__}: {error}"}
        self._restart(variation, error, then=lambda: self._reset_loaded(variation))
        self._episode_live = False
        return StepResult("The environment stopped unexpectedly and was restarted; the episode ends here.",
                          reward=0.0, score=score, done=True, truncated=True, info=info)

    def close(self) -> None:
        """Shut the gateway down and stop the JVM. Safe to call twice."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._episode_live = False
        self._kill_jvm(force=False)
        _LIVE.discard(self)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Running one step, in a fresh process or in this one.

A fresh process per step keeps memory from piling up across heavy steps (export then
validate of GPT-2 would otherwise hold two models), gives each step an honest peak-RSS
figure, and lets a crash or OOM kill fail that step alone.

A step that imports heavy modules first (``StepSpec.imports``: torch, and transformers for a
Hugging Face model) forks from a warm process that imported every planned step's once
(``WarmForks``), one per build: importing ``transformers.modeling_utils`` alone takes 5-6 s
on 2 cores, and a tiny model's steps spent three quarters of their time importing. Other
steps start as a fresh ``spawn`` process, whose memory figure then holds only what they import.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from onnxbuild.engine import testhooks
from onnxbuild.errors import OnnxbuildError
from onnxbuild.spec import Limits, StepContext, StepResult, StepSpec

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext, SpawnContext


@dataclass(frozen=True)
class Task:
    """A step to run: its spec, its context (input and output folders) and where its log goes."""

    spec: StepSpec
    ctx: StepContext
    log_path: str


@dataclass(frozen=True)
class Outcome:
    """How a step ended: its result, or the error (and detail for the log), time and peak memory."""

    ok: bool
    result: StepResult | None = None
    error: str = ""
    detail: str = ""
    seconds: float = 0.0
    peak_rss_mb: float | None = None
    attempts: int = 1
    """How many times it ran (a Ray task whose worker died is run again)."""


def run_task(task: Task) -> Outcome:
    """Run a step here and now; errors become a failed Outcome, never an exception."""
    start = time.perf_counter()
    try:
        module = sys.modules.get(task.spec.entry) or importlib.import_module(task.spec.entry)
        with testhooks.reading(task.ctx.recipe_name, task.spec.name):
            result: StepResult = module.run(task.ctx, task.spec)
    except OnnxbuildError as exc:
        return Outcome(False, error=str(exc), seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb())
    except MemoryError:
        return Outcome(
            False, error="ran out of memory", seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb()
        )
    except Exception as exc:  # a bug or a library failure: keep the traceback for the log file
        detail = traceback.format_exc()
        message = f"{type(exc).__name__}: {exc}".strip()
        if len(message) > 800:
            message = message[:800] + " ..."
        return Outcome(
            False, error=message, detail=detail, seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb()
        )
    return Outcome(True, result=result, seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb())


def _peak_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def _child(conn: Connection, task: Task) -> None:
    log = open(task.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log

    def emit(message: str) -> None:
        log.write(message + "\n")

    task = replace(task, ctx=replace(task.ctx, log=emit))
    test_delay(task.spec.kind, emit)
    outcome = _importable(task) or run_task(task)
    if outcome.detail:
        log.write(outcome.detail)
    conn.send(outcome)
    conn.close()


def _importable(task: Task) -> Outcome | None:
    """A failed Outcome when this fresh process cannot import the step's module (a kind
    registered in the parent from a module made in memory), else None."""
    try:
        importlib.import_module(task.spec.entry)
    except ImportError as exc:
        return Outcome(
            False,
            error=f"the {task.spec.kind} step kind was registered from module {task.spec.entry!r}, "
            f"which a step process cannot import ({exc}); register an importable module or build in-process",
        )
    return None


TEST_DELAY_ENV = "ONNXBUILD_TEST_STEP_DELAY"


def test_delay(kind: str, emit: Callable[[str], None]) -> None:
    """Test hook: with ONNXBUILD_TEST_STEP_DELAY="<kind>:<seconds>[:<once-file>]", a step process sleeps
    that long before running a step of that kind (after logging that it does), so a test
    can kill a build in the middle of a step (tests/test_concurrency.py). Not for users.
    """
    value = os.environ.get(TEST_DELAY_ENV)
    if not value:
        return
    target, _, rest = value.partition(":")
    seconds, _, once = rest.partition(":")
    if target != kind:
        return
    if once:  # "<kind>:<s>:<file>": only the first attempt sleeps (a retried step then runs)
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    emit(f"test hook: sleeping {seconds}s before the {kind} step (pid {os.getpid()})")
    time.sleep(float(seconds))


def _own_group() -> None:
    """In a step process: lead a process group of its own, so that stopping the step stops
    whatever it started too (a factory's helper processes, a tokenizer pool)."""
    try:
        os.setpgid(0, 0)
    except (AttributeError, OSError):  # pragma: no cover - Windows
        pass
    if sys.platform.startswith("linux"):
        # Out of the build's process group, a step would outlive a SIGKILLed build (the OOM
        # killer, `kill -9`): have the kernel kill it when the build process dies.
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl
            pass
        if os.getppid() == 1:  # the build died before prctl took effect
            os._exit(1)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends, then raised as they came.

    A spawned process reads its task from a pipe its parent writes after starting it: a build
    interrupted in between closed the pipe on a half-written task, and the step process
    printed a traceback (EOFError) into the build's output (CI's kill loop saw it). Python
    runs its handlers in the main thread only, so holding them there holds them all."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if got:
            signal.raise_signal(got[0])  # to the handler it was meant for


def _entry(conn: Connection, task: Task, environ: dict[str, str]) -> None:
    from multiprocessing import forkserver

    # A forked step inherits the fork server's "alive" pipe, and the server only exits (killing
    # its steps through PR_SET_PDEATHSIG) once every holder closed it: held here, a SIGKILLed
    # build would leave its steps running to the end, and the build's stdout open.
    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)  # private: no public way to reach it
    if alive is not None:
        os.close(alive)
        setattr(server, "_forkserver_alive_fd", None)  # noqa: B010 - typeshed does not know the attribute
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a forked step inherits it ignored
    _own_group()
    # A forked step inherits the warm process's environment, fixed when the build's first
    # heavy step started it; the step gets the build's environment of now, as a spawned one does.
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    _child(conn, task)


class WarmForks:
    """The build's warm process (multiprocessing's fork server, with the planned steps' ``imports``
    preloaded), shared by the builds running in this process and stopped when the last of them
    ends, so a library caller keeps no 400 MB process around between builds. A module missing
    here is skipped (the step that needs it says so itself)."""

    _lock = threading.Lock()
    _users = 0

    @classmethod
    def available(cls) -> bool:
        import multiprocessing

        return "forkserver" in multiprocessing.get_all_start_methods()

    @classmethod
    def acquire(cls, imports: Iterable[str]) -> None:
        import multiprocessing

        with cls._lock:
            if cls._users == 0:
                # sorted: the same plan preloads in the same order, so its steps see the same state
                multiprocessing.get_context("forkserver").set_forkserver_preload(sorted(set(imports)))
            cls._users += 1

    @classmethod
    def start(cls) -> None:
        """Start it without waiting: it imports while the build goes on, and the first fork waits for it.

        It starts with Ctrl-C ignored: it sits in the build's process group, and the fork server
        ignores SIGINT only once its imports are done, so a Ctrl-C in the first seconds printed
        its KeyboardInterrupt traceback into the build's output (steps restore it, ``_entry``)."""
        import signal
        from multiprocessing import forkserver

        main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            forkserver.ensure_running()
        finally:
            if main:
                signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)

    @classmethod
    def release(cls) -> None:
        from multiprocessing import forkserver

        with cls._lock:
            cls._users -= 1
            if cls._users == 0:
                # multiprocessing has no public way to stop its fork server
                stop = getattr(forkserver._forkserver, "_stop", None)
                if stop is not None:  # else it ends with this process, as a spawned helper would
                    try:
                        stop()
                    except OSError:  # it had died already (an import raised while it started)
                        pass


def forks_warm(spec: StepSpec) -> bool:
    """Whether a step of this spec forks from the build's warm process."""
    return bool(spec.imports)


class ChildStep:
    """A step running in its own process (and process group), watched from this one.

    The recipe's limits are enforced here, outside the step: a step whose C code holds
    the GIL for a minute, or allocates faster than it can be sampled from inside, is
    still stopped on time, with its whole process group.
    """

    POLL_S = 0.05

    def __init__(self, task: Task, *, warm: bool = False) -> None:
        import multiprocessing  # 5 ms, and a no-op build starts no step

        self._context: ForkServerContext | SpawnContext = (
            multiprocessing.get_context("forkserver") if warm else multiprocessing.get_context("spawn")
        )
        self.task = task
        self._recv, send = self._context.Pipe(duplex=False)
        ctx = StepContext(**{**task.ctx.__dict__, "log": print})
        self.process = self._context.Process(
            target=_entry, args=(send, replace(task, ctx=ctx), dict(os.environ)), daemon=True
        )
        try:
            with _signals_deferred():
                self.process.start()
        except BaseException:  # interrupted once it had started: nobody else knows of it
            if self.process.pid is not None:
                self.kill()
            raise
        finally:
            send.close()
        self.started = time.perf_counter()
        self.stopped: Outcome | None = None
        self._done = threading.Event()
        limits = task.spec.limits
        if limits.memory_mb or limits.seconds:
            threading.Thread(target=self._watch, args=(limits,), daemon=True).start()

    def _watch(self, limits: Limits) -> None:
        """Sample the step's process tree; past a limit, kill the group and say by how much."""
        import psutil

        peak = 0.0
        try:
            root = psutil.Process(self.process.pid)
        except psutil.Error:
            return
        while not self._done.wait(self.POLL_S) and self.process.is_alive():
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                continue
            peak = max(peak, rss / (1024 * 1024))
            elapsed = time.perf_counter() - self.started
            message = ""
            if limits.memory_mb and peak > limits.memory_mb:
                message = (
                    f"stopped at {peak:,.0f} MB resident, over limits.memory_mb ({limits.memory_mb:,} MB) "
                    "for this step; raise the limit in the recipe if the model needs it"
                )
            elif limits.seconds and elapsed > limits.seconds:
                message = (
                    f"stopped after {elapsed:,.2f} s, over limits.seconds ({limits.seconds:g} s) for this step; "
                    "raise the limit in the recipe if the step needs it"
                )
            if message:
                self.stopped = Outcome(False, error=message, seconds=elapsed, peak_rss_mb=round(peak, 1))
                self.kill()
                return

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def outcome(self) -> Outcome:
        """Collect the result of a finished process (or explain how it died)."""
        self._done.set()
        if self.stopped is not None:
            self.process.join()
            self._recv.close()
            return self.stopped
        result: Outcome | None = None
        try:
            if self._recv.poll():
                result = self._recv.recv()
        except (EOFError, OSError):
            result = None
        self.process.join()
        self._recv.close()
        if result is not None:
            return result
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        hint = " (out of memory?)" if code == -9 else ""
        return Outcome(
            False,
            error=f"the step's process {how}{hint} before reporting a result",
            seconds=time.perf_counter() - self.started,
        )

    def kill(self) -> None:
        """Stop the step and every process it started (its process group)."""
        import signal

        pid = self.process.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (AttributeError, OSError):  # no group yet (it had not started), or Windows
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

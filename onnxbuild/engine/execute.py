"""Running one step, in a fresh process or in this one.

A fresh ``spawn`` process per step keeps memory from piling up across heavy steps
(export then validate of GPT-2 would otherwise hold two models), gives each step an
honest peak-RSS figure, and lets a crash or OOM kill fail that step alone.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from onnxbuild.errors import OnnxbuildError
from onnxbuild.steps import step_module
from onnxbuild.steps.base import StepContext, StepResult, StepSpec


@dataclass(frozen=True)
class Task:
    spec: StepSpec
    ctx: StepContext
    log_path: str


@dataclass(frozen=True)
class Outcome:
    ok: bool
    result: StepResult | None = None
    error: str = ""
    detail: str = ""
    seconds: float = 0.0
    peak_rss_mb: float | None = None
    outputs: tuple[str, ...] = field(default_factory=tuple)


def run_task(task: Task) -> Outcome:
    """Run a step here and now; errors become a failed Outcome, never an exception."""
    start = time.perf_counter()
    try:
        module = step_module(task.spec.kind)
        result: StepResult = module.run(task.ctx, task.spec)
    except OnnxbuildError as exc:
        return Outcome(False, error=str(exc), seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb())
    except MemoryError:
        return Outcome(False, error="ran out of memory", seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb())
    except Exception as exc:  # a bug or a library failure: keep the traceback for the log file
        detail = traceback.format_exc()
        message = f"{type(exc).__name__}: {exc}".strip()
        if len(message) > 800:
            message = message[:800] + " ..."
        return Outcome(False, error=message, detail=detail, seconds=time.perf_counter() - start, peak_rss_mb=_peak_rss_mb())
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

    task = Task(task.spec, StepContext(**{**task.ctx.__dict__, "log": emit}), task.log_path)
    outcome = run_task(task)
    if outcome.detail:
        log.write(outcome.detail)
    conn.send(outcome)
    conn.close()


class ChildStep:
    """A step running in its own process."""

    _context = multiprocessing.get_context("spawn")

    def __init__(self, task: Task) -> None:
        self.task = task
        self._recv, send = self._context.Pipe(duplex=False)
        ctx = StepContext(**{**task.ctx.__dict__, "log": print})
        self.process = self._context.Process(target=_child, args=(send, Task(task.spec, ctx, task.log_path)), daemon=True)
        self.process.start()
        send.close()
        self.started = time.perf_counter()

    @property
    def sentinel(self) -> Any:
        return self.process.sentinel

    def outcome(self) -> Outcome:
        """Collect the result of a finished process (or explain how it died)."""
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
        return Outcome(False, error=f"the step's process {how}{hint} before reporting a result", seconds=time.perf_counter() - self.started)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

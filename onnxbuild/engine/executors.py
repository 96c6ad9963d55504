"""Where a step runs: a local process (the default) or a task on a Ray cluster
(engine/cluster.py, ``--executor ray``).

The planner, the cache keys, the manifest and the reports are the same whichever
executor runs a plan; an executor only starts a prepared step and says when it is done.
The runner gives every step a scratch folder with its inputs in ``in/`` and expects its
outputs in ``out/``. ``local`` runs the step in a fresh process on this machine (``-j N`` at
once); a step that imports torch or transformers first forks from the build's warm process
(execute.WarmForks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from onnxbuild.engine.execute import ChildStep, Outcome, Task, WarmForks, forks_warm
from onnxbuild.spec import Resources, StepSpec


class Handle(Protocol):
    """A started step: its outcome when finished, or kill it."""

    def outcome(self) -> Outcome: ...
    def kill(self) -> None: ...


class Executor(Protocol):
    """Where steps run (this machine's processes, a Ray cluster): start, wait for any, check resources, close."""

    name: str

    def start(self, task: Task, resources: Resources, inputs: dict[str, str], outputs: Sequence[str]) -> Handle: ...
    def wait(self, handles: Sequence[Handle], timeout: float | None) -> list[Handle]: ...
    def check(self, needs: Sequence[tuple[str, Resources]]) -> None: ...
    def prepare(self, specs: Sequence[StepSpec]) -> None: ...
    def close(self) -> None: ...


class LocalExecutor:
    """A fresh process per step on this machine: forked from the warm process for heavy steps, else spawned."""

    name = "local"

    def __init__(self) -> None:
        self._warm = False
        self._broken = False
        """The warm process died starting (an import raised more than ImportError): steps are spawned."""

    def prepare(self, specs: Sequence[StepSpec]) -> None:
        """Start the warm process now when a step to run will fork from it: its imports (seconds)
        then overlap the light steps that come first (source, check)."""
        if any(forks_warm(s) for s in specs) and WarmForks.available():
            self._acquire([m for s in specs for m in s.imports])

    def _acquire(self, imports: Sequence[str]) -> None:
        if not self._warm:
            WarmForks.acquire(imports)
            self._warm = True
            WarmForks.start()

    def start(self, task: Task, resources: Resources, inputs: dict[str, str], outputs: Sequence[str]) -> Handle:
        warm = forks_warm(task.spec) and WarmForks.available() and not self._broken
        if not warm:
            return ChildStep(task)
        self._acquire(task.spec.imports)  # prepared already, unless the caller skipped prepare
        try:
            return ChildStep(task, warm=True)
        except (EOFError, OSError):  # the server died importing: this build spawns its steps, as before
            self._broken = True
            return ChildStep(task)

    def wait(self, handles: Sequence[Handle], timeout: float | None) -> list[Handle]:
        from multiprocessing.connection import wait

        by_sentinel = {h.sentinel: h for h in handles}  # type: ignore[attr-defined]
        return [by_sentinel[s] for s in wait(list(by_sentinel), timeout=timeout)]

    def check(self, needs: Sequence[tuple[str, Resources]]) -> None:
        pass  # a local step that needs what this machine lacks says so itself (e.g. no CUDA device)

    def close(self) -> None:
        if self._warm:
            self._warm = False
            WarmForks.release()


# ---------------------------------------------------------------- Ray

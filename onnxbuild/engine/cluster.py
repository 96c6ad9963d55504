"""Steps as tasks on a Ray cluster (``--executor ray``); the local executor is engine/executors.py.

A step runs as a Ray task, placed by the resources it declares (CPUs, memory, GPUs). On a
cluster this process started (``ray.init`` with no address) the scratch folder is on the
same disk, so the task reads and writes it directly. On a cluster reached by address, a
task on another node must not read this machine's disk: it pulls its inputs from the
remote cache by digest through its node's own cache (``ONNXBUILD_CACHE_DIR`` on that node,
else ~/.cache/onnxbuild/ray-node), so a node downloads an object once, runs in a fresh
folder there, commits its outputs to that cache, pushes them, and returns their digests;
this process then pulls them (checking each digest) into the scratch folder, and commits
as usual. Tasks spread over the nodes; a step whose outputs belong to the machine that
measured them (benchmark, machine, a hardware-bound optimize: ``StepSpec.measured``) runs
only on a node with this machine's CPU, since its key names this one's. Ray retries a task
whose worker dies (``max_retries``); a half-done attempt leaves nothing behind, because
only the runner commits, from complete outputs, and the report counts the attempts.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from onnxbuild._util import brief
from onnxbuild.engine.execute import Outcome, Task, run_task
from onnxbuild.engine.executors import Handle
from onnxbuild.engine.testhooks import pause_for_tests
from onnxbuild.errors import UsageError
from onnxbuild.spec import Resources, StepSpec

if TYPE_CHECKING:
    from ray import ObjectRef

    from onnxbuild.engine.cache import Cache


@dataclass(frozen=True)
class RaySettings:
    """How to reach Ray and what a remote step may retry or pull from."""

    address: str | None = None
    """None: start a Ray instance in this process (a local cluster); else ``auto`` or ``ray://host:port``."""
    max_retries: int = 2
    remote_url: str | None = None
    num_cpus: int | None = None
    """For a local instance: CPUs to give it (default: this machine's)."""


def _ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'onnxbuild[ray]' (or pip install ray)") from None
    return ray


def _run_shared(task: Task) -> Outcome:
    """A Ray task on a node that shares this machine's disk: the step's own process, as locally.

    A retried attempt (its worker died) finds what the dead one wrote in ``out/``: it starts
    from an empty folder, so nothing half-written is committed as if this attempt wrote it."""
    wrong = versions_differ(task)
    if wrong is not None:
        return wrong
    out = task.ctx.output_dir
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return replace(_logged(task), attempts=_attempt())


def _attempt() -> int:
    """Which attempt of its Ray task this is, from 1 (Ray's own count; 1 where it cannot say)."""
    try:
        import ray

        core = getattr(ray._private.worker.global_worker, "core_worker", None)  # Ray's own, untyped
        return int(core.get_current_task_attempt_number()) + 1 if core is not None else 1
    except Exception:  # a Ray without that call: the report then counts one
        return 1


def versions_differ(task: Task) -> Outcome | None:
    """A failed Outcome when a package the step's key names has another version in this process,
    or its onnxbuild code differs (a node of a cluster installed differently from the machine that
    planned), else None: the step would file outputs of other code under the key."""
    from onnxbuild.environment import package_version

    differ = {
        name: (package_version(name), wanted)
        for name, wanted in sorted(task.ctx.versions.items())
        if package_version(name) != wanted
    }
    if differ:
        shown = "; ".join(f"{name} {here} here, {wanted} in the key" for name, (here, wanted) in differ.items())
        return Outcome(
            False,
            error=f"this node's packages differ from the step's key ({shown}): install the planning machine's "
            "versions on every node (pip install -c constraints.txt ...)",
        )
    return code_differs(task)


def code_differs(task: Task) -> Outcome | None:
    """A failed Outcome when the onnxbuild code this node would run differs from the code the
    step's key holds (a node with another onnxbuild checkout or version), else None."""
    from onnxbuild.engine.codekeys import Code

    if not task.ctx.code:  # a key computed without code (a kind registered from outside the package)
        return None
    spec = task.spec
    here = Code().reach((spec.entry, *spec.code_also), spec.code_stops)
    differ = sorted(m for m in set(here) | set(task.ctx.code) if here.get(m) != task.ctx.code.get(m))
    if not differ:
        return None
    shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
    return Outcome(
        False,
        error=f"this node's onnxbuild code differs from the step's key ({shown}): install the planning "
        "machine's onnxbuild on every node",
    )


NODE_CACHE_ENV = "ONNXBUILD_CACHE_DIR"
"""On a node of a cluster: the folder of that node's own cache (objects pulled and made there)."""


def node_cache() -> Cache:
    """This node's cache: where a remote task keeps the objects it pulled and the ones it made."""
    from onnxbuild.engine.cache import Cache

    root = os.environ.get(NODE_CACHE_ENV)
    cache = Cache(Path(root) if root else Path.home() / ".cache" / "onnxbuild" / "ray-node")
    cache.ensure_writable()
    cache.clean_scratch()  # the folders of attempts whose worker died
    return cache


def _run_remote(
    task: Task, remote_url: str, inputs: dict[str, str], outputs: Sequence[str]
) -> tuple[Outcome, dict[str, str]]:
    """A Ray task on any node: inputs by digest through the node's cache (pulled from the remote
    cache once per node), outputs committed to the node's cache and pushed to the remote one."""
    from onnxbuild._util import sha256_file
    from onnxbuild.engine.remote import RemoteCache

    wrong = versions_differ(task)
    if wrong is not None:
        return wrong, {}
    remote = RemoteCache(remote_url)
    node = node_cache()
    work = node.scratch()  # each attempt its own, beside the node's objects (a rename apart)
    try:
        (work / "in").mkdir()
        (work / "out").mkdir()
        for rel, sha in inputs.items():
            stored = node.object_path(sha)
            if not stored.is_file():
                remote.get_object(sha, stored)  # the digest checked on the way in
                os.chmod(stored, 0o444)
            _place(stored, work / "in" / rel)
        ctx = replace(task.ctx, input_dir=work / "in", output_dir=work / "out")
        outcome = _logged(replace(task, ctx=ctx, log_path=str(work / "step.log")))
        pushed: dict[str, str] = {}
        if outcome.ok:
            for f in sorted((work / "out").rglob("*")):
                if f.is_file():
                    sha = sha256_file(f)
                    stored = node.object_path(sha)
                    if not stored.is_file():
                        stored.parent.mkdir(parents=True, exist_ok=True)
                        os.chmod(f, 0o444)
                        os.replace(f, stored)
                    pushed[f.relative_to(work / "out").as_posix()] = remote.put_object(stored, sha)
                    if len(pushed) == 1:
                        pause_for_tests("push", task.spec.name)  # one output pushed, the rest not yet
        return replace(outcome, attempts=_attempt()), pushed
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _place(stored: Path, dest: Path) -> None:
    """An input in the step's folder: a hard link to the node's read-only object, or a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(stored, dest)
    except OSError:
        shutil.copyfile(stored, dest)


def machine_identity() -> tuple[str, str, int]:
    """What a measured step's key says of the machine: CPU model, CPU fingerprint, CPU count."""
    from onnxbuild import environment

    return environment.cpu_info()[0], environment.cpu_fingerprint(), os.cpu_count() or 1


def _logged(task: Task) -> Outcome:
    """run_task with the step's output going to its log file, as a local step process does."""
    import sys

    Path(task.log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(task.log_path, "a", buffering=1, encoding="utf-8") as log:
        old_out, old_err = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = log

        def emit(message: str) -> None:
            log.write(message + "\n")

        try:
            task = replace(task, ctx=replace(task.ctx, log=emit))
            from onnxbuild.engine.execute import test_delay

            test_delay(task.spec.kind, emit)
            outcome = run_task(task)
            if outcome.detail:
                log.write(outcome.detail)
            return outcome
        finally:
            sys.stdout, sys.stderr = saved
            os.dup2(old_out, 1)
            os.dup2(old_err, 2)
            os.close(old_out)
            os.close(old_err)


def _discard(message: str) -> None:
    pass


class RayHandle:
    """A step submitted to Ray as a task."""

    def __init__(self, executor: RayExecutor, ref: ObjectRef[Outcome], task: Task) -> None:
        self.executor = executor
        self.ref = ref
        self.task = task
        self.started = time.perf_counter()

    def outcome(self) -> Outcome:
        ray = _ray()
        try:
            got = ray.get(self.ref)
        except Exception as exc:  # the task failed past its retries, or was cancelled
            name = type(exc).__name__
            return Outcome(
                False,
                error=f"the Ray task failed ({name}: {brief(exc)}) after {self.executor.settings.max_retries} retries",
                seconds=time.perf_counter() - self.started,
            )
        if isinstance(got, Outcome):
            return got
        outcome, pushed = got
        if outcome.ok:
            self.executor.fetch_outputs(pushed, self.task.ctx.output_dir)
        return outcome  # type: ignore[no-any-return]

    def kill(self) -> None:
        _ray().cancel(self.ref, force=True)


class RayExecutor:
    """Steps as Ray tasks, placed by their declared resources."""

    name = "ray"

    def __init__(self, settings: RaySettings) -> None:
        ray = _ray()
        self.settings = settings
        self.local = settings.address is None
        if not self.local and not settings.remote_url:
            raise UsageError(
                f"--executor ray with --ray-address {settings.address}: steps on other nodes exchange inputs "
                "and outputs through the remote cache, and none is configured; "
                "give --cache-url (or [tool.onnxbuild] cache_url), "
                "or leave out --ray-address to start a local Ray instance that shares this machine's cache"
            )
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if self.local:
                kwargs["num_cpus"] = settings.num_cpus or os.cpu_count() or 1
            else:
                kwargs["address"] = settings.address
            try:
                ray.init(**kwargs)
            except Exception as exc:
                raise UsageError(
                    f"cannot start or reach Ray ({settings.address or 'local instance'}): {brief(exc)}"
                ) from None
            self._started = True
        # max_calls=1: a fresh worker process per step, as locally (memory returned between
        # steps, an honest peak RSS, a GPU context freed).
        self._shared = ray.remote(max_calls=1)(_run_shared)
        self._remote = ray.remote(max_calls=1)(_run_remote)
        self._bound: list[str] = []
        """Nodes with this machine's CPU, where a measured step may run (prepare finds them)."""
        self._next_bound = 0

    def prepare(self, specs: Sequence[StepSpec]) -> None:
        """Each task is a fresh Ray worker process; on a cluster reached by address, find the
        nodes a measured step may run on, and refuse the build before anything runs if none."""
        measured = [s for s in specs if s.measured]
        if self.local or not measured:
            return
        here = machine_identity()
        found = self.identities()
        self._bound = sorted(node for node, identity in found.items() if identity == here)
        if not self._bound:
            seen = "; ".join(f"{node[:8]}: {cpu} ({fp[:12]}, {n} CPUs)" for node, (cpu, fp, n) in sorted(found.items()))
            raise UsageError(
                f"{', '.join(s.name for s in measured)} measure the machine their key names, this one "
                f"({here[0]}, {here[1][:12]}, {here[2]} CPUs), and no node of the Ray cluster is that machine "
                f"(nodes: {seen or 'none with CPUs'}): add such a node, or build those steps on this machine "
                "(--executor local)"
            )

    def identities(self) -> dict[str, tuple[str, str, int]]:
        """Each alive node with CPUs -> machine_identity() as a task pinned to it reports."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0, max_retries=0)(machine_identity)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]
        refs = [
            probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in nodes
        ]
        return {node: tuple(identity) for node, identity in zip(nodes, ray.get(refs), strict=True)}

    def check(self, needs: Sequence[tuple[str, Resources]]) -> None:
        """Refuse, before anything runs, a step that no node of the cluster can take."""
        ray = _ray()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        problems = []
        for label, r in needs:
            fits = any(
                n["Resources"].get("CPU", 0) >= r.cpus
                and n["Resources"].get("GPU", 0) >= r.gpus
                and n["Resources"].get("memory", float("inf")) >= r.memory_mb * 1024 * 1024
                for n in nodes
            )
            if fits:
                continue
            gpus = max((n["Resources"].get("GPU", 0) for n in nodes), default=0)
            cpus = max((n["Resources"].get("CPU", 0) for n in nodes), default=0)
            if r.gpus > gpus:
                problems.append(f"{label} needs {r.gpus} GPU ({r.why_gpu}) but no node of the Ray cluster has one")
            elif r.cpus > cpus:
                problems.append(f"{label} needs {r.cpus:g} CPUs but the largest node has {cpus:g}")
            else:
                problems.append(f"{label} needs about {r.memory_mb} MB of memory, more than any node offers")
        if problems:
            raise UsageError(
                "the Ray cluster cannot run every step: "
                + "; ".join(problems)
                + ". Add such nodes, or drop what needs them from the recipe"
            )

    def start(self, task: Task, resources: Resources, inputs: dict[str, str], outputs: Sequence[str]) -> Handle:
        # The worker logs to the step's log file; the driver's callback (print, possibly
        # wrapped by Ray itself) need not, and sometimes cannot, be pickled.
        task = replace(task, ctx=replace(task.ctx, log=_discard))
        options: dict[str, object] = {
            "num_cpus": resources.cpus,
            "num_gpus": resources.gpus,
            "max_retries": self.settings.max_retries,
            "retry_exceptions": False,
        }
        if self.local:
            ref = self._shared.options(**options).remote(task)
        else:
            assert self.settings.remote_url is not None
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from onnxbuild.engine.remote import RemoteCache

            if task.spec.measured and self._bound:
                node = self._bound[self._next_bound % len(self._bound)]
                self._next_bound += 1
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            else:
                options["scheduling_strategy"] = "SPREAD"  # a build's steps over every node

            # Inputs built before the remote cache was configured may be missing there;
            # the runner has already placed them in the step's in/ folder on this machine.
            remote = RemoteCache(self.settings.remote_url)
            for rel, sha in inputs.items():
                remote.put_object(task.ctx.input_dir / rel, sha)
            ref = self._remote.options(**options).remote(task, self.settings.remote_url, inputs, list(outputs))
        return RayHandle(self, ref, task)

    def wait(self, handles: Sequence[Handle], timeout: float | None) -> list[Handle]:
        ray = _ray()
        by_ref = {h.ref: h for h in handles}  # type: ignore[attr-defined]
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        return [by_ref[r] for r in ready]

    def fetch_outputs(self, pushed: dict[str, str], out: Path) -> None:
        from onnxbuild.engine.remote import RemoteCache

        assert self.settings.remote_url is not None
        remote = RemoteCache(self.settings.remote_url)
        for rel, sha in pushed.items():
            remote.get_object(sha, out / rel)

    def close(self) -> None:
        if self._started:
            _ray().shutdown()

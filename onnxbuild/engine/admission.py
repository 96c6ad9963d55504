"""A step whose memory estimate exceeds this machine's memory is refused before it starts.

Each step kind states its peak as a multiple of the model's fp32 weights plus the interpreter
(``StepKind.memory``; the plan turns it into ``Resources.memory_mb``). A step that would pass
the machine's memory is killed by the kernel part-way (a Llama-3.2-1B-shaped ``optimize``
was, at 22.4 GB on a 23 GB machine), after minutes of work and with nothing said; refused
here, it fails at once with the estimate, the machine's memory and what to do. A recipe that
knows better sets ``limits.steps.<step>.memory_mb``: that cap, where it fits, is taken over the
estimate.
"""

from __future__ import annotations

from onnxbuild.spec import Limits, StepSpec

HEADROOM = 0.95
"""The share of the machine's memory a step may plan to use: the rest is the OS and the build."""


def machine_mb() -> int:
    """This machine's physical memory in MB (or the container's, where a cgroup caps it lower)."""
    import psutil

    total = psutil.virtual_memory().total
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            cap = f.read().strip()
        if cap.isdigit():
            total = min(total, int(cap))
    except OSError:
        pass
    return int(total // (1024 * 1024))


def refusal(spec: StepSpec, limits: Limits, total_mb: int | None = None) -> str | None:
    """Why ``spec`` must not start here (its estimate is over this machine's memory), or None."""
    total = machine_mb() if total_mb is None else total_mb
    need = spec.resources.memory_mb
    if limits.memory_mb is not None and limits.memory_mb <= total:
        need = limits.memory_mb  # the recipe's own cap: it is stopped there anyway
    if need <= HEADROOM * total:
        return None
    basis = f" ({spec.resources.memory_basis})" if spec.resources.memory_basis else ""
    return (
        f"not started: {spec.name} needs about {need / 1024:.1f} GB by its estimate{basis}, more than "
        f"{HEADROOM:.0%} of this machine's {total / 1024:.1f} GB, so it would be killed part-way. Build it on "
        "a machine with more memory or from a smaller model shape; if the estimate is too high for this "
        f"model, set limits.steps.{spec.name}.memory_mb in the recipe to what it needs"
    )

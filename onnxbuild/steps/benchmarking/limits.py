"""The roofline of each timed row: what its graph computes and reads at that shape, and the
fraction of the machine's measured limit it reached (the limits measured again when a row
beats them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Final

from onnxbuild.report.benchmark import row_name, shape_text
from onnxbuild.steps.base import StepContext
from onnxbuild.steps.machine import PEAKS

if TYPE_CHECKING:
    import onnx

    from onnxbuild.steps.benchmarking.timing import BaselineRow, DecodeRow, Feeds, Measured, Row, WorkNote
    from onnxbuild.steps.roofline import Peaks, Phase, Work

WORK: Final = "_work"
"""A row's private note for the roofline pass (the graph, precision, phase and input shapes of
one call), removed before the report is written."""


def work_note(path: str | Path, precision: str, feeds: Feeds | None = None, phase: Phase = "decode") -> WorkNote:
    """What the roofline pass needs to count one row's work: its graph, precision and phase;
    ``feeds`` the call's inputs (a decode row's come from the step that timed it)."""
    note: WorkNote = {"path": str(path), "precision": precision, "phase": phase}
    if feeds is not None:
        note["shapes"] = shapes_of_feeds(feeds)
    return note


def _work_of(path: str | Path, precision: str, feeds: Feeds | None = None, phase: Phase = "decode") -> Measured:
    """:func:`work_note` under the key a row keeps it."""
    return {"_work_of": work_note(path, precision, feeds, phase)}


def shapes_of_feeds(feeds: Feeds) -> dict[str, list[int]]:
    return {k: [int(d) for d in v.shape] for k, v in feeds.items()}


def attach_roofline(
    ctx: StepContext, rows: list[Row | BaselineRow | DecodeRow], threads: int
) -> dict[str, object] | None:
    """Each row noted by ``_work_of``: the matrix-product FLOPs and weight bytes of one call,
    and its share of the machine's limit (onnxbuild/steps/roofline.py); returns the peaks used.

    PyTorch's rows count the exported graph's products (the same matrices), with weights half
    as many bytes in bf16. Rows on a GPU, in wasm or of an encoder-decoder get none.

    A row over 100% of its limit means the limit was measured low (a busy machine, a size too
    small): the peaks are measured again here, at a longer budget, each figure the higher of
    the two; a row still over it is marked ``over_limit``, and the report says the limit is
    wrong rather than print "180% of bf16 GEMM" as if it were a figure."""
    from onnxbuild.steps.peaks import measure_peaks
    from onnxbuild.steps.roofline import Peaks

    notes = [(row, row.pop("_work_of", None), row.pop(WORK, None)) for row in rows]
    try:
        peaks = Peaks.from_dict(json.loads(ctx.input(PEAKS).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    works = _works(notes)
    _rooflines(works, peaks)
    over = [row for row, _ in works if row["roofline"]["fraction"] > 1.0]
    remeasured = ""
    if over:
        first = over[0]
        again = peaks.at_least(measure_peaks(threads, budget_s=REMEASURE_S))
        rose = [
            k
            for k in ("fp32_gflops", "bf16_gflops", "int8_gops", "memory_gbps")
            if getattr(again, k) != getattr(peaks, k)
        ]
        remeasured = (
            f"{row_name(dict(first))} at {shape_text(first.get('shape') or {})} "
            f"reached {first['roofline']['fraction']:.0%} "
            f"of {first['roofline']['limit']}: measured again, "
            + (f"{', '.join(rose)} rose" if rose else "no figure rose")
        )
        peaks = again
        _rooflines(works, peaks)
        for row, _ in works:
            if row["roofline"]["fraction"] > 1.0:
                row["roofline"]["over_limit"] = True
    out: dict[str, object] = {**peaks.as_dict(), "loaded": peaks.loaded}
    if remeasured:
        out["remeasured"] = remeasured
    return out


REMEASURE_S = 0.5
"""Seconds per figure and size when a row beat the cached peaks (the machine step uses 0.15)."""


Counted = tuple["Row | BaselineRow | DecodeRow", tuple["Work", str, "Phase", float]]
"""A timed row and what the roofline reads of it: its work, precision, phase and time (ms)."""


def _works(
    notes: list[tuple[Row | BaselineRow | DecodeRow, WorkNote | None, dict[str, list[int]] | None]],
) -> list[Counted]:
    """(row, (its work, precision, phase, ms)) for each row whose graph the counter can size."""
    import dataclasses

    import onnx

    from onnxbuild.steps.graphwork import graph_work

    loaded: tuple[str, onnx.ModelProto] | None = None
    counted: dict[
        str, Work | None
    ] = {}  # graph and shapes -> its work (PyTorch's fp32 and bf16 rows, OpenVINO's rows share ONNX Runtime's)
    out: list[Counted] = []
    noted = [(row, note, decode_shapes) for row, note, decode_shapes in notes if note]
    for row, note, decode_shapes in sorted(noted, key=lambda n: n[1]["path"]):
        shapes = note.get("shapes") or decode_shapes
        if not shapes:
            continue
        key = json.dumps([note["path"], shapes], sort_keys=True)
        if key not in counted:
            if loaded is None or loaded[0] != note["path"]:  # one model in memory at a time
                loaded = (note["path"], onnx.load_model(note["path"]))
            try:
                counted[key] = graph_work(loaded[1], {k: tuple(v) for k, v in shapes.items()})
            except Exception:  # a graph the counter cannot size: the row keeps its times only
                counted[key] = None
        work = counted[key]
        if work is None:
            continue
        if note["precision"] == "bf16":
            work = dataclasses.replace(work, weight_bytes=work.weight_bytes // 2)
        ms = row["decode_p50_ms"] if note["phase"] == "decode" else row["p50_ms"]
        row["work"] = {"flops": work.flops, "weight_bytes": work.weight_bytes, "uncounted": list(work.uncounted)}
        out.append((row, (work, note["precision"], note["phase"], ms)))
    return out


def _rooflines(works: list[Counted], peaks: Peaks) -> None:
    from onnxbuild.steps.roofline import roofline

    for row, (work, precision, phase, ms) in works:
        found = roofline(work, ms, precision, peaks, phase).as_dict()
        row["roofline"] = {
            "gflops": found["gflops"],
            "gbps": found["gbps"],
            "bound": found["bound"],
            "limit": found["limit"],
            "fraction": found["fraction"],
            "min_ms": found["min_ms"],
            "precision": precision,
            "phase": phase,
        }

"""The command's entry point (``onnxbuild`` and ``python -m onnxbuild``): signal handling first,
everything else after.

Kept free of imports beyond the standard library so that the handlers are in place before
click, the API and the engine load (about 0.15 s): an interrupt during start-up or during
Python's shutdown must end like one during a build, with exit 130 and no traceback, never
with the process killed by the signal.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def _terminated(signum: int, frame: FrameType | None) -> None:
    # CI cancels and `docker stop` send SIGTERM: unwind like Ctrl-C, so running step
    # processes are stopped with their process groups and nothing partial is kept.
    raise KeyboardInterrupt


def main(args: list[str] | None = None) -> None:
    from onnxbuild.engine.testhooks import pause_for_tests
    from onnxbuild.errors import INTERRUPTED, INTERRUPTED_EXIT

    signal.signal(signal.SIGTERM, _terminated)
    code: int | str | None
    try:
        pause_for_tests("startup", "")
        from onnxbuild.cli import cli

        cli(args, prog_name="onnxbuild")
        code = 0
    except KeyboardInterrupt:
        # Only reached outside a command's own handler (start-up, click's parsing).
        print(INTERRUPTED, file=sys.stderr)
        code = INTERRUPTED_EXIT
    except SystemExit as exc:
        code = exc.code
    # The command is over and its result decided: a signal now (thread pools are joined at
    # exit) must not turn that result into a death by signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pause_for_tests("exit", str(code))
    sys.exit(code)


if __name__ == "__main__":
    main()

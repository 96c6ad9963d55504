"""Whether ``report.html`` is already the page a folder's files would render, without
importing the renderer (12 ms of a 0.15 s no-op).

A page is a function of onnxbuild's code (its .py files, by path, size and mtime: any edit
renders the page again, with no list of the renderer's imports to keep true), the folder's
path, ``manifest.json`` (which
holds the digest of every file a step wrote there, and so of every file the page reads)
and ``timings.json``; a no-op rewrites neither of those byte for byte, so its page is the
one already there. The key of those is written into the page, after its doctype, with the
digest of the rest of the page, so a page edited or cut short by hand is written again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MARK = "<!-- onnxbuild page "
PACKAGE = Path(__file__).resolve().parent.parent


def page_key(folder: Path) -> str:
    """sha256 of what the page of ``folder`` is rendered from."""
    digest = hashlib.sha256(str(folder).encode())
    for where, folders, files in os.walk(PACKAGE):
        folders[:] = sorted(f for f in folders if f not in ("node_modules", "__pycache__"))
        for name in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(where, name))
            digest.update(f"{where}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for path in (folder / "manifest.json", folder / "timings.json"):
        try:
            data = path.read_bytes()
        except OSError:
            data = b"\0missing"
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def with_marker(key: str, doctype: str, rest: str) -> str:
    """The page: its doctype, the marker line, then the rest."""
    return f"{doctype}\n{MARK}{key} {hashlib.sha256(rest.encode()).hexdigest()} -->\n{rest}"


def is_current(folder: Path) -> bool:
    """True when ``folder/report.html`` is a plain file carrying this folder's key, and the
    rest of it is what was written."""
    page = folder / "report.html"
    if page.is_symlink() or not page.is_file():
        return False
    try:
        text = page.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    doctype, _, after = text.partition("\n")
    line, _, rest = after.partition("\n")
    return text == with_marker(page_key(folder), doctype, rest) if line.startswith(MARK) else False

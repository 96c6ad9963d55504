"""Which model types each transformers Auto class loads, read from the installed transformers'
own table (models/auto/modeling_auto.py) without importing it: importing it imports torch
(2 s), and the recipe layer must stay light. So a task given a model type its Auto class
cannot build is refused at the recipe, naming the class, instead of failing at export.

The file is parsed (``ast``), not run: ``Name = OrderedDict([(type, class), ...])`` tables,
``X_MAPPING = _LazyAutoMapping(CONFIG_MAPPING_NAMES, X_MAPPING_NAMES)`` and each Auto class's
``_model_mapping = X_MAPPING``. A transformers whose file no longer reads so gives no table,
and the check then says nothing (the export step still names what failed).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.cache
def _tables() -> dict[str, frozenset[str]]:
    """Auto class name -> the model types it loads (empty when the file cannot be read)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    names: dict[str, frozenset[str]] = {}
    lazy: dict[str, str] = {}
    classes: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                if value.func.id == "OrderedDict" and value.args and isinstance(value.args[0], ast.List):
                    names[target] = frozenset(
                        str(e.elts[0].value)
                        for e in value.args[0].elts
                        if isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)
                    )
                elif value.func.id == "_LazyAutoMapping" and len(value.args) == 2:
                    table = value.args[1]
                    if isinstance(table, ast.Name):
                        lazy[target] = table.id
        elif isinstance(stmt, ast.ClassDef):
            for inner in stmt.body:
                if (
                    isinstance(inner, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "_model_mapping" for t in inner.targets)
                    and isinstance(inner.value, ast.Name)
                ):
                    classes[stmt.name] = inner.value.id
    return {cls: names[lazy[m]] for cls, m in classes.items() if m in lazy and lazy[m] in names}


def loads(auto_class: str, model_type: str) -> bool | None:
    """Whether ``auto_class`` builds a ``model_type`` model (None: transformers' table unreadable)."""
    table = _tables().get(auto_class)
    return None if table is None else model_type in table


def known_types() -> frozenset[str]:
    """Every model type some Auto class loads."""
    return frozenset().union(*_tables().values()) if _tables() else frozenset()

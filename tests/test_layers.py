"""The package's layers (docs/DESIGN.md, "Layers"): a module imports only from its own layer or the ones below, and
no two modules import each other, however indirectly. Read from the source with `ast`, so that the imports inside
functions (the lazy ones, which keep `--help` free of torch) and under `TYPE_CHECKING` count too. Also read with
`ast`: no function of the package is longer than MAX_FUNCTION_LINES. And docs/DESIGN.md, the map a reader finds where
a line belongs from, names every module as it is (`ppo/build.py`, relative to ppo_rlhf/) and no module that is not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ppo_rlhf"
DESIGN = PACKAGE.parent / "docs" / "DESIGN.md"
MAX_FUNCTION_LINES = 60  # from `def` to its last line: a longer one is several steps, each of which wants a name

# bottom to top; a module's layer is that of its first name under ppo_rlhf ("" is ppo_rlhf/__init__.py)
LAYERS: list[tuple[str, ...]] = [
    ("errors", "utils"),
    ("config",),
    ("data",),
    ("parallel",),
    ("models",),
    ("rewards", "multiturn"),
    ("ppo",),
    ("", "api", "export", "train"),
    ("study",),
    ("tasks",),
    ("cli", "__main__"),
]


def module_name(path: Path) -> str:
    parts = ["ppo_rlhf", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """{module: the ppo_rlhf modules it imports anywhere in its source}; `from ppo_rlhf.x import name` counts as
    importing `ppo_rlhf.x.name` where that is a module, else `ppo_rlhf.x`."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{module}: a relative import (the package imports by absolute names)"
                base = node.module or ""
                found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names}
        graph[module] = {name for name in found if name in modules and name != module}
    return graph


def layer(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    [index] = [i for i, names in enumerate(LAYERS) if first in names]
    return index


def test_every_module_has_a_layer():
    for module in imports():
        layer(module)  # (raises for a top-level name LAYERS does not place)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{module} -> {name}" for module, names in imports().items() for name in sorted(names)
              if layer(name) > layer(module)]
    assert not upward, "imports that run upward:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph, cycles = imports(), []
    state: dict[str, str] = {}  # "open" while its imports are being walked, then "done"

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for name in sorted(graph[module]):
            if state.get(name) == "open":
                cycles.append(" -> ".join(path[path.index(name):] + [name]))
            elif name not in state:
                walk(name, [*path, name])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_function_is_longer_than_max_function_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(long)


def design_names() -> set[str]:
    """The names written in backticks in docs/DESIGN.md, outside its fenced blocks."""
    text = re.sub(r"^```.*?^```", "", DESIGN.read_text(), flags=re.DOTALL | re.MULTILINE)
    return set(re.findall(r"`([^`\n]+)`", text))


def test_design_names_every_module():
    """A new module gets its line in DESIGN.md's map (as `package/module.py`, relative to ppo_rlhf/) in the same
    commit, or the map goes stale without anyone noticing."""
    named = design_names()
    missing = [relative for path in sorted(PACKAGE.rglob("*.py")) if path.name not in ("__init__.py", "__main__.py")
               and (relative := path.relative_to(PACKAGE).as_posix()) not in named]
    assert not missing, "modules docs/DESIGN.md does not name (as `package/module.py`):\n" + "\n".join(missing)


def test_every_module_path_in_design_exists():
    """A renamed, moved or deleted module leaves no name behind in DESIGN.md: every `name.py` there is a file, relative
    to ppo_rlhf/ (`ppo/build.py`) or to the repository (`ppo_rlhf/ppo/build.py`, `bench/vllm_check.py`)."""
    stale = sorted(name for name in design_names() if re.fullmatch(r"[\w/]+\.py", name)
                   and not (PACKAGE / name).is_file() and not (PACKAGE.parent / name).is_file())
    assert not stale, "docs/DESIGN.md names files that do not exist (or not by their path):\n" + "\n".join(stale)

"""The package's floors are its architecture: imports point one way (cli -> bench -> API -> spec /
train -> runtime -> base modules), no library module imports the CLI, and there are no cycles.
Read from the source with `ast`, function-local imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import longswift

PKG = Path(longswift.__file__).parent

# What each floor may import besides itself. The top-level modules are split in two: the base
# (configs, errors, sampling, stats, files) that every floor uses, and the Python API.
BASE = {"config", "errors", "atomic", "sampling", "stats", "prompts", "jsonl", "detok", "stop_strings"}
API = {"engine", "encoding", "stream", "generate", "checkpoint", "__init__"}
ALLOWED = {
    "base": {"base"},
    "runtime": {"runtime", "base"},
    "spec": {"spec", "runtime", "base"},
    "train": {"train", "spec", "runtime", "base"},
    "api": {"api", "spec", "runtime", "base"},
    "bench": {"bench", "api", "spec", "runtime", "base"},
    "cli": {"cli", "bench", "api", "train", "spec", "runtime", "base"},
    "main": {"main", "cli"},  # the entry points: __main__ (python -m) and console (the `longswift` script)
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts)


def floor(module: str) -> str:
    head = module.split(".")[0]
    if head in ("runtime", "spec", "train", "bench", "cli"):
        return head
    if head in ("__main__", "console"):
        return "main"
    if head in BASE:
        return "base"
    if head in API:
        return "api"
    raise AssertionError(f"top-level module '{module}' belongs to no floor: add it to BASE or API")


def imports_of(path: Path) -> set[str]:
    """Modules of the package imported by `path`, as names relative to the package."""
    module = module_name(path)
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("longswift"):
                    base = node.module.split(".")[1:]
                else:
                    continue
            else:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                candidate = ".".join(base + [alias.name])
                if (PKG / (candidate.replace(".", "/") + ".py")).exists() or (PKG / candidate.replace(".", "/")).is_dir():
                    found.add(candidate)  # `from . import module`
                elif base:
                    found.add(".".join(base))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("longswift."):
                    found.add(alias.name.removeprefix("longswift."))
    return {m for m in found if m and m != module}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PKG.rglob("*.py"))}


def test_imports_point_one_way():
    wrong = []
    for module, targets in graph().items():
        for target in targets:
            if floor(target) not in ALLOWED[floor(module)]:
                wrong.append(f"{module} ({floor(module)}) imports {target} ({floor(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_library_module_imports_the_cli():
    offenders = [m for m, targets in graph().items()
                 if floor(m) not in ("cli", "main") and any(t.split(".")[0] == "cli" for t in targets)]
    assert offenders == []


def test_no_import_cycles():
    # Package __init__ files re-export (longswift/__init__ imports the API); an edge to a package
    # itself stands for its __init__ and is left out, as is `from . import __version__`.
    g = {m: {t for t in ts if t not in ("", "__init__") and not (PKG / t.replace(".", "/")).is_dir()}
         for m, ts in graph().items() if not m.endswith("__init__")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, stack: list[str]) -> bool:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycle.extend(stack[stack.index(t):] + [m, t] if t in stack else [m, t])
                return True
            if state.get(t) is None and visit(t, stack + [t]):
                return True
        state[m] = 2
        return False

    for m in sorted(g):
        if state.get(m) is None and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_rules_see_real_imports():
    g = graph()
    assert "runtime.model" in g["spec.tokenswift"]
    assert "runtime.cache" in g["runtime.model"]
    assert {"cli.generate", "cli.bench"} <= g["cli.__init__"]  # `from . import generate, bench, ...`
    assert floor("runtime.attention" if (PKG / "runtime/attention.py").exists() else "runtime.model") == "runtime"


def test_the_package_type_checks():
    """The package ships py.typed, so type checkers read its hints as the API's: they hold (mypy, with
    pyproject's [tool.mypy]: the minimum Python, the package's sources). 118 errors went unseen before this test,
    among them a forced cascade's None mask that crashed on CUDA."""
    from mypy import api

    root = PKG.parents[1]
    if not (root / "pyproject.toml").is_file():  # (an installed copy, not the checkout: no config to check with)
        raise AssertionError(f"run the tests from a checkout installed with pip install -e: {PKG}")
    out, err, status = api.run(["--config-file", str(root / "pyproject.toml"), str(PKG)])
    assert status == 0, out + err

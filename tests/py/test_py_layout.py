"""The Python package's modules import one another without a circle (issue #31), read from the
code itself (ast), as test_layout.py reads the C++ tree's includes.

Every intra-package import counts, at module level or inside a function: `from . import x`,
`from .x import y`, `from .. import x`, `import airhost.x`, `from airhost.x import y` (not importlib's, such as the
lazy names of data/__init__.py). A cycle fails naming its modules in order; so does the import
that made the circle issue #31 undid, _jobs importing _api."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runtime" / "python" / "airhost"
NAME = "airhost"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path = PACKAGE) -> dict:
    """{module name: its file} for every module of the package."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def top_level_names(path: Path) -> set:
    """The names a module binds at its top level (what `from module import name` can get)."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def imports(path: Path, name: str, mods: dict) -> set:
    """The package's modules that the module `name` (at `path`) imports, anywhere in it: the
    module itself, and the packages above it whose __init__ the import runs (not those above
    the importer: they are under way already). `from package import name` counts the package
    when its __init__ binds that name, and a submodule not in the tree (an extension module,
    _native) counts for nothing."""
    is_package = path.name == "__init__.py"
    root = name.split(".")[0]
    mine = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_package)}
    found = set()

    def add(module):
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            ancestor = ".".join(parts[:i])
            if ancestor in mods and ancestor not in mine and ancestor != name:
                found.add(ancestor)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root:
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == root:
                module = node.module
            else:
                continue
            add(module)
            for alias in node.names:
                if f"{module}.{alias.name}" in mods:  # `from . import x`: the module x
                    add(f"{module}.{alias.name}")
                elif module in mods and alias.name in top_level_names(mods[module]):
                    found.add(module)  # a name of the module (a package's __init__ included)
    return found


def import_graph(package: Path = PACKAGE) -> dict:
    mods = modules(package)
    return {name: imports(path, name, mods) for name, path in mods.items()}


def find_cycle(graph: dict):
    """A list of modules [a, b, ..., a] that import one another in a circle, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "airhost._api" in graph and "airhost.data._checkpoint" in graph, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "the package's modules import one another in a circle: " + " -> ".join(cycle)


def test_jobs_does_not_import_the_api():
    graph = import_graph()
    assert "airhost._errors" in graph["airhost._jobs"] and "airhost._payload" in graph["airhost._jobs"]
    assert "airhost._api" not in graph["airhost._jobs"], graph["airhost._jobs"]


def test_the_walk_shared_with_the_rank_imports_nothing_of_the_package():
    # Its text runs ahead of bootstrap.py in airhost-rank (runtime/bootstrap_py.hpp.in).
    assert import_graph()["airhost._by_value"] == set()
    tree = ast.parse((PACKAGE / "_by_value.py").read_text())
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in ast.walk(tree))


def test_cmake_reads_every_file_the_rank_source_is_made_of():
    # configure_file leaves an unknown @VAR@ empty: a rank without the walk would name every
    # function of the caller's __main__ "<dynamic-code>", with nothing to say why.
    template = (ROOT / "runtime" / "bootstrap_py.hpp.in").read_text()
    wanted = set(re.findall(r"@(AIRHOST_\w+)@", template))
    assert wanted == {"AIRHOST_BY_VALUE_PY", "AIRHOST_BOOTSTRAP_PY"}, wanted
    read = dict((var, path) for path, var in re.findall(r"file\(READ\s+(\S+)\s+(AIRHOST_\w+)\)",
                                                        (ROOT / "CMakeLists.txt").read_text()))
    assert read.get("AIRHOST_BY_VALUE_PY") == "runtime/python/airhost/_by_value.py", read
    assert read.get("AIRHOST_BOOTSTRAP_PY") == "runtime/bootstrap.py", read


@pytest.mark.parametrize("how", ["module-level", "in-function", "from-package"])
def test_the_cycle_check_catches_a_circle(tmp_path, how):
    pkg = tmp_path / NAME
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._a import A\n")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("from . import _b\nA = 1\n")
    back = {"module-level": "from . import _a\n",
            "in-function": "def f():\n    from ._a import A\n    return A\n",
            "from-package": "def f():\n    from .. import _a\n"}[how]
    if how == "from-package":
        (pkg / "_b.py").write_text("from .data import _c\n")
        (pkg / "data" / "_c.py").write_text(back)
        want = ["airhost._a", "airhost._b", "airhost.data._c", "airhost._a"]
    else:
        (pkg / "_b.py").write_text(back)
        want = ["airhost._a", "airhost._b", "airhost._a"]
    graph = import_graph(pkg)
    assert find_cycle(graph) == want, graph
    (pkg / "_a.py").write_text("A = 1\n")
    assert find_cycle(import_graph(pkg)) is None

"""The package's layering: imports inside unweight/ run one way (no cycle, function-level
imports included), and only the ops layer touches the native extensions' raw pointers."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unweight")


def _modules() -> dict:
    mods = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = "unweight." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: str, mods: dict) -> set:
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            # a package's __init__ re-exporting its own children is not an edge between layers
            if t and t != name and t != "unweight" and not (is_pkg and t.startswith(name + ".")):
                out.add(t)
    return out


def test_no_import_cycle():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_raw_pointers_and_cuda_module_only_in_the_ops_layer():
    ops_dir = os.path.join(ROOT, "ops") + os.sep
    offenders = []
    for name, path in _modules().items():
        if path.startswith(ops_dir):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr == "data_ptr":
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} data_ptr")
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if any(n.rpartition(".")[2] == "_cuda" for n in names) or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_cuda")):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} imports _cuda")
    assert not offenders, offenders

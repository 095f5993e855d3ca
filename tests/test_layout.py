"""The layout DESIGN.md §3 draws, held: imports point one way down the ladder, no module
imports itself back through another, the agent ships without the console, services never
import the gateway, and no module reaches into another's private names (a helper two modules
need is public in one of them). A module is as long as its one concept needs: none fails for
its length, and those past FLAG_LINES are listed in the output for a look."""

import ast
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
# placement → nodes → fleets → audit → tuneplane core; every app may call audit.
LADDER = {"tuneplane": 0, "audit": 1, "fleets": 2, "nodes": 3, "placement": 4}
# The composition root sits above every app.
COMPOSITION_ROOT = {"tuneplane.urls", "tuneplane.settings", "tuneplane.grpc_handlers"}
FLAG_LINES = 600
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def modules() -> dict[str, Path]:
    found = {}
    for app in LADDER:
        for path in (ROOT / app).rglob("*.py"):
            relative = path.relative_to(ROOT)
            # build/: the copy `pip wheel nodes/agent` lays out while the agent's wheels are
            # built in another xdist worker (git ignores it); not a module of the console.
            if "migrations" in relative.parts or "build" in relative.parts:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` run for the type checker, never at run time."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for inner in ast.walk(node):
                lines.add(getattr(inner, "lineno", -1))
    return lines


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that ``name`` imports, at the top or inside a function."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module
            )
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    ours = set()
    for target in found:
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in known and target != name:
            ours.add(target)
    return ours


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_imports_point_down_the_ladder():
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name not in COMPOSITION_ROOT
        for target in targets
        if LADDER[target.split(".")[0]] > LADDER[name.split(".")[0]]
        and target.split(".")[0] != "audit"
    )
    assert not upward, "upward imports: " + "; ".join(upward)


def test_no_import_cycle():
    graph = import_graph()
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(name):  # Tarjan: every strongly connected set of two or more modules
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in graph[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while not component or component[-1] != name:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


def test_the_agent_imports_nothing_of_the_console():
    """tuneplane-node ships on its own (no Django, no other app); the gateway imports the
    agent's wire module, never the other way round."""
    graph = import_graph()
    agent = {name for name in graph if name.startswith("nodes.agent")}
    outside = sorted(
        f"{name} imports {target}"
        for name in agent
        for target in graph[name]
        if target not in agent
    )
    assert not outside, "; ".join(outside)
    django = sorted(name for name in agent if "django" in modules()[name].read_text())
    assert not django, f"the agent mentions Django: {django}"


def test_services_never_import_the_gateway():
    graph = import_graph()
    offending = sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if not name.startswith(("nodes.gateway", "tuneplane."))
        and not name.startswith("nodes.management")
        for target in targets
        if target.startswith("nodes.gateway")
    )
    assert not offending, "; ".join(offending)


def private_imports(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """``from x import _y`` and ``x._y`` where x is another module of ours: each one named."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    bound: dict[str, str] = {}  # a local name → the module of ours it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in known and base != name and _private(alias.name):
                    found.append(f"{name} imports {base}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and bound[node.value.id] != name
            and _private(node.attr)
        ):
            found.append(f"{name} uses {bound[node.value.id]}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_into_another_modules_private_names():
    known = modules()
    reaching = sorted(
        found
        for name, path in known.items()
        if not path.name.endswith(GENERATED)
        for found in private_imports(name, path, known)
    )
    assert not reaching, "private names used across modules: " + "; ".join(reaching)


def long_modules() -> list[tuple[int, str]]:
    """Modules past FLAG_LINES, longest last: not a ceiling (a module about one concept may be
    long), a list for a look, printed at the end of every run (tests/conftest.py)."""
    paths = [path for path in modules().values() if not path.name.endswith(GENERATED)]
    return sorted(
        (lines, str(path.relative_to(ROOT)))
        for path in paths
        if (lines := len(path.read_text().splitlines())) > FLAG_LINES
    )

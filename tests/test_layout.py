"""The package's layout: imports run one way, so no module of rlhf_jax imports its caller."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rlhf_jax"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports, at the top or inside functions alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from rlhf_jax.reward import ibt` imports the module rlhf_jax.reward.ibt.
            found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return found


def imports(path: Path, modules: set[str]) -> set[str]:
    """The rlhf_jax modules ``path`` imports."""
    return imported_names(path) & modules


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(paths)) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules, or None (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                return stack[stack.index(child):] + [child]
            if child not in state and (cycle := visit(child)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_of_rlhf_jax_imports_its_caller():
    graph = import_graph()
    assert "rlhf_jax.loop" in graph["rlhf_jax.driver"]  # the graph sees real imports
    assert "rlhf_jax.trainer" in graph["rlhf_jax.cli"]  # ... those inside functions too
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_loop_knows_no_driver_and_the_label_app_no_training():
    graph = import_graph()

    def reachable(start):
        seen, todo = set(), [start]
        while todo:
            for child in graph[todo.pop()] - seen:
                seen.add(child)
                todo.append(child)
        return seen

    drivers = {"rlhf_jax.driver", "rlhf_jax.host_loop", "rlhf_jax.people_seam", "rlhf_jax.trainer", "rlhf_jax.sweep",
               "rlhf_jax.cli"}
    assert not reachable("rlhf_jax.loop") & drivers
    assert not any(m.startswith("rlhf_jax.agents") for m in reachable("rlhf_jax.feedback.webapp"))


def test_no_module_of_rlhf_jax_imports_the_benchmarks_or_the_experiments():
    """The library stands alone: benchmarks/ and experiments/ import rlhf_jax, never the reverse."""
    outside = {"benchmarks", "experiments"}
    found = {module_name(p): hits for p in PACKAGE.rglob("*.py")
             if (hits := {name.split(".")[0] for name in imported_names(p)} & outside)}
    assert not found, found

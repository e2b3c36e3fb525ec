"""The house's import layers, held (docs/architecture.md draws them).

Every import in kvops/, plugins/kvops_vllm/ and bench/ is read with `ast`: at module level, inside functions and
under `if TYPE_CHECKING:` alike, since a lazy import ties two files as much as an eager one. Each file belongs to a
layer of LAYERS; an import may point down or stay in its layer, never up, and no files may import each other in a
loop. The KV guard runs inside vLLM: of kvops it imports the policy, the formula and the errors alone. A failure
names the file and line of each import at fault.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"kvops": ROOT / "kvops", "kvops_vllm": ROOT / "plugins" / "kvops_vllm", "bench": ROOT / "bench"}

# Bottom to top. A name covers the module and, for a package, everything in it, unless a longer name places a part
# elsewhere; NAME.__init__ covers the package's own __init__.py alone. A new file that no name covers fails the test:
# place it here (and in docs/architecture.md).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ground",
        (
            "kvops.__init__",
            "kvops.errors",
            "kvops.settings",
            "kvops.units",
            "kvops.dtypes",
            "kvops.files",
            "kvops.packaged",
            "kvops.frozen",
            "kvops.gpus",
            "kvops.workload",
            "kvops.speculative",
            "kvops.tokens",
            "kvops.nvidia_smi",
            "kvops.cpu_features",
            "kvops.catalog",
            "kvops.data",
        ),
    ),
    ("model", ("kvops.model",)),
    ("formula", ("kvops.formula",)),
    ("policy", ("kvops.policy",)),
    ("vocabulary", ("kvops.plan", "kvops.profile", "kvops.overheads", "kvops.calibration", "kvops.deployment")),
    ("engines", ("kvops.engines",)),
    ("planner", ("kvops.planner",)),
    ("simulation", ("kvops.simulate",)),
    ("runs", ("kvops.calibrate", "kvops.explain", "kvops.sweep")),
    ("render", ("kvops.render",)),
    ("watch", ("kvops.watch",)),
    ("deploy", ("kvops.deploy",)),
    ("cli", ("kvops.cli", "kvops.__main__")),
    ("KV guard", ("kvops_vllm",)),  # runs inside vLLM: nothing of kvops imports it
    ("bench", ("bench", "tests")),  # tests/ is not read; nothing below bench may import it
)

# What the KV guard, inside vLLM's own process, may import of kvops.
GUARD_IMPORTS = ("kvops.policy", "kvops.formula", "kvops.errors", "kvops.settings")

# Imports that break a rule above today, each with why it stays for now. The test fails when one is gone: strike it.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("kvops_vllm.middleware", "kvops.engines.api"): "the in-process admission takes the proxy's route shapes",
    ("kvops_vllm.middleware", "kvops.engines.vllm.api"): "the in-process admission takes vLLM's generation routes",
    ("kvops_vllm.middleware", "kvops.watch.guard"): "the in-process admission takes the proxy's pure guard",
}


def _module_name(package: str, base: Path, path: Path) -> str:
    parts = [package, *path.relative_to(base).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the house by its dotted name (bench/x.py is bench.x)."""
    return {
        _module_name(package, base, path): path
        for package, base in SOURCES.items()
        for path in sorted(base.rglob("*.py"))
        if "node_modules" not in path.parts
    }


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module of the house, line) for every import in the file, resolved to the longest module that exists.

    bench's scripts put bench/ on sys.path, so a bare `import accuracy` there is bench.accuracy."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if name.startswith("bench.") and target.split(".")[0] not in ("kvops", "kvops_vllm", "bench", "tests"):
                target = f"bench.{target}"
            if target == "tests" or target.startswith("tests."):
                found.append(("tests", node.lineno))
                continue
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return sorted(set(found), key=lambda item: item[1])


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the name that covers it, layer)
    for index, (_, names) in enumerate(LAYERS):
        for entry in names:
            own = entry.removesuffix(".__init__")
            covers = module == own if entry.endswith(".__init__") else module == own or module.startswith(own + ".")
            if covers and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def edges() -> dict[str, list[tuple[str, int]]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def where(module: str, line: int) -> str:
    return f"{modules()[module].relative_to(ROOT)}:{line}"


def test_every_file_has_a_layer():
    unplaced = sorted(name for name in modules() if layer_of(name) is None)
    assert not unplaced, f"no layer for {', '.join(unplaced)}: place each in LAYERS (tests/unit/test_layers.py)"


def test_no_import_points_up():
    upward = []
    for source, targets in edges().items():
        low = layer_of(source)
        for target, line in targets:
            high = layer_of(target)
            if low is not None and high is not None and high > low and (source, target) not in EXCEPTIONS:
                upward.append(
                    f"{where(source, line)} imports {target}: layer {LAYERS[high][0]!r} is above {LAYERS[low][0]!r}"
                )
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_exceptions_are_still_there():
    graph = edges()
    gone = [f"{source} -> {target}" for source, target in EXCEPTIONS if target not in dict(graph.get(source, []))]
    assert not gone, f"no longer imported, strike from EXCEPTIONS: {', '.join(gone)}"


def test_no_files_import_each_other_in_a_loop():
    graph = edges()
    circles = [circle for circle in _strongly_connected(graph) if len(circle) > 1]
    lines = []
    for circle in circles:
        members = set(circle)
        ties = [
            f"  {where(source, line)} imports {target}"
            for source in sorted(members)
            for target, line in graph[source]
            if target in members
        ]
        lines += [f"{len(circle)} files: {', '.join(sorted(circle))}", *ties]
    assert not circles, "import cycles:\n" + "\n".join(lines)


def test_the_kv_guard_imports_the_policy_formula_and_errors_alone():
    graph = edges()
    foreign = [
        f"{where(source, line)} imports {target}"
        for source in graph
        if source.split(".")[0] == "kvops_vllm"
        for target, line in graph[source]
        if target.split(".")[0] == "kvops" and target not in GUARD_IMPORTS and (source, target) not in EXCEPTIONS
    ]
    assert not foreign, f"the KV guard imports only {', '.join(GUARD_IMPORTS)} of kvops:\n" + "\n".join(foreign)


def test_the_reader_sees_lazy_and_type_checking_imports(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvops.plan import Plan\n"
        "def f():\n    from kvops.engines import common\n    import kvops.units\n"
    )
    known = {"kvops.plan", "kvops.engines", "kvops.engines.common", "kvops.units"}
    assert imports("kvops.lazy", module, known) == [("kvops.plan", 3), ("kvops.engines.common", 5), ("kvops.units", 6)]


def _strongly_connected(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the sets of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(target for target, _ in graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(t for t, _ in graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    circle = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        circle.append(member)
                        if member == node:
                            break
                    found.append(circle)
    return found

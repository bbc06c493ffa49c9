"""The package's import direction (docs/architecture.md): autograd <- dispatch <- tensor <- functional <-
composites, nn, optim, models. Each layer imports only layers below it, directly, lazily inside a function, or
through another module of the package, so a cycle between the layers cannot come back. Read from the sources
with ast; nothing is imported."""

import ast
import os

import pytest

import infinitrain

PACKAGE = "infinitrain"
ROOT = os.path.dirname(os.path.abspath(infinitrain.__file__))

# Layer of each module (a subpackage stands for every module in it); higher layers may import lower ones only.
LAYERS = {
    "infinitrain.autograd": 0,
    "infinitrain.dispatch": 1,
    "infinitrain.tensor": 2,
    "infinitrain.functional": 3,
    "infinitrain.composites": 4,
    "infinitrain.nn": 4,
    "infinitrain.optim": 4,
    "infinitrain.models": 4,
}
# Layers 0-3 are each one module; in the top layer, composites and optim are checked too (their imports reach no
# sibling of the top layer).
CHECKED = ["autograd", "dispatch", "tensor", "functional", "composites", "optim"]


def layer_of(module):
    for name, layer in LAYERS.items():
        if module == name or module.startswith(name + "."):
            return layer, name
    return None, None


def module_files(root=ROOT, package=PACKAGE):
    """{module name: source path} of every .py file of the package."""
    out = {}
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        for f in files:
            if f.endswith(".py"):
                name = ".".join(parts + ([] if f == "__init__.py" else [f[:-3]]))
                out[name] = os.path.join(folder, f)
    return out


def imports_of(module, source, modules):
    """[(imported module, line, lazy)] of one module's source: module-level imports and those inside functions
    (lazy). `from infinitrain import x` imports the submodule x when there is one, else the package itself."""
    tree = ast.parse(source)
    is_package = any(m.startswith(module + ".") for m in modules)  # an __init__.py: `.` is the package itself
    found = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append((alias.name, child.lineno, lazy))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in modules else target, child.lineno, lazy))
            visit(child, inner)

    visit(tree, False)
    return [(name, line, lazy) for name, line, lazy in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def import_graph(files):
    """{module: [(imported module, line, lazy)]} over the package's modules."""
    modules = set(files)
    graph = {}
    for name, path in files.items():
        with open(path, encoding="utf-8") as f:
            graph[name] = imports_of(name, f.read(), modules)
    return graph


def violations(graph):
    """Each way a checked module reaches a module of its own layer or above: a direct import (lazy ones
    included) into a higher layer, or a chain of module-level imports through unlayered modules."""
    out = []
    for module in graph:
        layer, own = layer_of(module)
        if layer is None or not any(own == f"{PACKAGE}.{c}" for c in CHECKED):
            continue
        # Breadth-first over module-level imports; the package's __init__ (imported by everything) is left out.
        seen, frontier = {module: None}, [module]
        for name, line, lazy in graph[module]:
            if lazy:
                target_layer, target = layer_of(name)
                if target_layer is not None and target != own and target_layer >= layer:
                    out.append(f"{module}:{line} imports {name} (layer {target_layer}) inside a function")
        while frontier:
            current = frontier.pop(0)
            for name, _line, lazy in graph.get(current, []):
                if lazy or name == PACKAGE or name in seen:
                    continue
                seen[name] = current
                target_layer, target = layer_of(name)
                if target == own:
                    continue
                if target_layer is not None and target_layer >= layer:
                    chain, at = [name], current
                    while at is not None:
                        chain.append(at)
                        at = seen[at]
                    out.append(f"{module} reaches {name} (layer {target_layer}): " + " <- ".join(chain))
                    continue
                if target_layer is None:  # an unlayered module: follow what it imports at module level
                    frontier.append(name)
    return out


def test_every_layer_exists():
    files = module_files()
    for name in LAYERS:
        assert name in files, f"{name} is not a module of the package any more: update LAYERS and the docs"


def test_imports_flow_one_way():
    problems = violations(import_graph(module_files()))
    assert not problems, "\n".join(problems)


def _graph_of(sources):
    files = dict(sources)
    modules = set(files)
    return {name: imports_of(name, src, modules) for name, src in files.items()}


@pytest.mark.parametrize(
    "sources,expected",
    [
        # tensor imports functional at module level: the cycle that tensor_methods.py was made to break.
        ({"infinitrain.tensor": "from infinitrain import functional\n", "infinitrain.functional": ""}, "reaches"),
        # dispatch imports tensor lazily.
        (
            {"infinitrain.dispatch": "def f():\n    from infinitrain.tensor import Tensor\n", "infinitrain.tensor": ""},
            "inside",
        ),
        # autograd reaches dispatch through an unlayered module.
        (
            {
                "infinitrain.autograd": "import infinitrain.amp\n",
                "infinitrain.amp": "from . import dispatch\n",
                "infinitrain.dispatch": "",
            },
            "infinitrain.dispatch <- infinitrain.amp <- infinitrain.autograd",
        ),
        # optim imports models (a sibling of the top layer counts as "above" for the checked ones).
        (
            {"infinitrain.optim.optimizers": "from infinitrain.models import GPT2\n", "infinitrain.models": ""},
            "reaches",
        ),
    ],
)
def test_the_check_finds_a_reversed_import(sources, expected):
    problems = violations(_graph_of(sources))
    assert any(expected in p for p in problems), problems


def test_the_check_allows_imports_downwards():
    sources = {
        "infinitrain.functional": "from infinitrain import autograd, dispatch\nfrom infinitrain.tensor import T\n",
        "infinitrain.tensor": "from . import dispatch\nimport infinitrain.random\n",
        "infinitrain.random": "",
        "infinitrain.dispatch": "from infinitrain import _C, autograd\n",
        "infinitrain.autograd": "import threading\n",
        "infinitrain.optim.optimizers": "from infinitrain import functional as F\nfrom infinitrain.optim import x\n",
        "infinitrain.optim": "from infinitrain.optim.optimizers import SGD\n",
    }
    assert violations(_graph_of(sources)) == []


def cycles(graph, prefixes):
    """Import circles among the modules under `prefixes`, lazy imports included (Tarjan's components)."""
    edges = {m: sorted({n for n, _, _ in v if n in graph and n.startswith(prefixes)}) for m, v in graph.items()}
    edges = {m: v for m, v in edges.items() if m.startswith(prefixes)}
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in edges:
        if v not in index:
            visit(v)
    return found


# The model files, the registry, model parallelism and the training layer import one way: families <- registry <-
# training, with no import inside a function to hold a circle apart.
NO_CIRCLES = ("infinitrain.models", "infinitrain.parallel", "infinitrain.training", "infinitrain.runs")


def test_no_import_circle_among_models_and_the_training_layer():
    found = cycles(import_graph(module_files()), NO_CIRCLES)
    assert not found, found


def test_the_circle_check_finds_one_held_apart_by_a_lazy_import():
    sources = {
        "infinitrain.models.hf": "def f():\n    from infinitrain.models import gpt2\n",
        "infinitrain.models.gpt2": "from infinitrain.models import hf\n",
    }
    assert cycles(_graph_of(sources), NO_CIRCLES) == [["infinitrain.models.gpt2", "infinitrain.models.hf"]]

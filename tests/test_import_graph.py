"""The package's import graph, read from source with `ast`: imports point down the layers, and no
library module imports a binary, nor is there a cycle.

An import inside a function counts like one at the top of the file. The failures name every import
that points the wrong way, and every cycle with the imports that close it.
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1] / "mlm_jax"


def module_names(root: pathlib.Path = PACKAGE_ROOT) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file under the package root."""
  out = {}
  for path in sorted(root.rglob("*.py")):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
  """The absolute module named by a (possibly relative) `from X import ...`."""
  if not node.level:
    return node.module or ""
  base = module.split(".") if is_package else module.split(".")[:-1]
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The package modules that `module` imports anywhere in its file (module level or in functions).

  `from a import b` counts as an import of `a.b` when that is a module, else of `a`. Importing a
  package runs its __init__, so an import of `a.b` is also one of `a` (unless `a` is the importer's
  own ancestor, which Python has already imported).
  """
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
  is_package = path.name == "__init__.py"
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = _resolve(module, is_package, node)
      for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        found.add(sub if sub in known else base)
  out = set()
  for name in found:
    while name and name not in known:   # `import a.b.c` of a non-module attribute path
      name = name.rpartition(".")[0]
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
      parent = ".".join(parts[:i])
      if parent in known and parent != module and not module.startswith(parent + "."):
        out.add(parent)
  return out


def graph(root: pathlib.Path = PACKAGE_ROOT) -> dict[str, set[str]]:
  names = module_names(root)
  known = set(names)
  return {m: imports_of(m, p, known) for m, p in names.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (or a module importing itself), sorted."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  counter = [0]

  def visit(v):   # Tarjan's algorithm; the package is small enough for recursion
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1 or v in edges.get(v, ()):
        out.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return sorted(out)


def describe(component: list[str], edges: dict[str, set[str]]) -> str:
  """One line: the component's modules and the imports that keep them together."""
  members = set(component)
  arrows = [f"{a} -> {b}" for a in component for b in sorted(edges[a] & members)]
  return f"{len(component)} modules: " + "; ".join(arrows)


# The layers, lowest first; a module may import its own layer and the ones before it. Layers that share
# a rank (objectives, data) may not import each other. `mlm_jax` itself (__init__.py) is a leaf.
LAYERS = (
    ("leaves", ("mlm_jax", "mlm_jax.errors", "mlm_jax.runtime", "mlm_jax.paths"), 0),
    ("config", ("mlm_jax.config",), 1),
    ("model", ("mlm_jax.model",), 2),
    ("objectives", ("mlm_jax.objectives",), 3),
    ("data", ("mlm_jax.data",), 3),
    ("workdir", ("mlm_jax.workdir",), 4),
    ("convert", ("mlm_jax.convert",), 5),
    ("training", ("mlm_jax.training",), 6),
    ("tasks", ("mlm_jax.tasks",), 7),
    ("evaluation", ("mlm_jax.evaluation",), 8),
    ("finetuning", ("mlm_jax.finetuning",), 9),
    ("binaries", ("mlm_jax.train", "mlm_jax.finetune", "mlm_jax.downstream"), 10),
)
# Imports allowed against the order, each with its reason.
EXCEPTIONS: dict = {}


def layer_of(module: str, layers=LAYERS) -> tuple[str, int]:
  """(layer name, rank) of a module: the layer of its longest matching prefix."""
  best = None
  for name, prefixes, rank in layers:
    for prefix in prefixes:
      if module == prefix or module.startswith(prefix + ".") and prefix != "mlm_jax":
        if best is None or len(prefix) > best[0]:
          best = (len(prefix), name, rank)
  if best is None:
    raise AssertionError(f"{module} belongs to no layer of tests/test_import_graph.py's LAYERS")
  return best[1], best[2]


def wrong_way(edges: dict[str, set[str]], layers=LAYERS, exceptions=EXCEPTIONS) -> list[str]:
  """One line per import that points up the layers or sideways between layers of one rank."""
  binaries = {p for name, prefixes, _ in layers if name == "binaries" for p in prefixes}
  allowed = {(a, ".".join(b.split(".")[:i])) for a, b in exceptions for i in range(2, b.count(".") + 2)}   # and
  out = []                                                                  # the packages the import runs
  for a in sorted(edges):
    la, ra = layer_of(a, layers)
    for b in sorted(edges[a]):
      lb, rb = layer_of(b, layers)
      if la == lb or (a, b) in allowed:
        continue
      if b in binaries:
        out.append(f"{a} -> {b}: library code imports a binary")
      elif rb >= ra:
        out.append(f"{a} ({la}) -> {b} ({lb}): points {'up' if rb > ra else 'sideways'} the layers")
  return out


def test_imports_point_down_the_layers():
  edges = graph()
  assert len(edges) > 60, f"expected the mlm_jax package at {PACKAGE_ROOT}"
  bad = wrong_way(edges)
  assert not bad, "imports against the layers of mlm_jax/ (tests/test_import_graph.py's LAYERS):\n" + "\n".join(bad)
  used = {(a, b) for a in edges for b in edges[a]}
  assert set(EXCEPTIONS) <= used, f"exceptions that no longer occur: {sorted(set(EXCEPTIONS) - used)}"


def test_a_wrong_way_import_is_found(tmp_path):
  """The checker itself: an upward import inside a function, a sideways one and a library module that
  imports a binary are each named; the allowed exception and same-layer imports are not."""
  pkg = tmp_path / "pkg"
  for sub in ("low", "mid", "side"):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("")
  (pkg / "low" / "a.py").write_text("def f():\n  from pkg.mid import b\n")          # up, in a function
  (pkg / "low" / "c.py").write_text("from pkg.low import a\n")                        # same layer
  (pkg / "mid" / "b.py").write_text("from pkg.low import c\nimport pkg.side.d\n")   # down; sideways
  (pkg / "side" / "d.py").write_text("from pkg import main\n")                        # a binary
  (pkg / "side" / "e.py").write_text("from pkg.mid import b\n")                       # up, excepted
  (pkg / "main.py").write_text("from pkg.mid import b\n")
  layers = (("leaves", ("pkg",), 0), ("low", ("pkg.low",), 1), ("mid", ("pkg.mid",), 2),
            ("side", ("pkg.side",), 2), ("binaries", ("pkg.main",), 3))
  bad = wrong_way(graph(pkg), layers, {("pkg.side.e", "pkg.mid.b"): "test"})
  assert bad == ["pkg.low.a (low) -> pkg.mid (mid): points up the layers",
                 "pkg.low.a (low) -> pkg.mid.b (mid): points up the layers",
                 "pkg.mid.b (mid) -> pkg.side (side): points sideways the layers",
                 "pkg.mid.b (mid) -> pkg.side.d (side): points sideways the layers",
                 "pkg.side.d -> pkg.main: library code imports a binary"], bad


def test_the_tree_has_few_loose_modules_and_no_name_twice():
  """At most 8 modules beside the packages; no module basename twice; none named like a builtin."""
  import builtins
  loose = sorted(p.name for p in PACKAGE_ROOT.glob("*.py"))
  assert len(loose) <= 8, loose
  names = {}
  for path in PACKAGE_ROOT.rglob("*.py"):
    if path.name != "__init__.py":
      names.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE_ROOT)))
  twice = {k: v for k, v in names.items() if len(v) > 1}
  assert not twice, twice
  shadowing = sorted(n for n in names if n in dir(builtins)) + sorted(
      str(p.relative_to(PACKAGE_ROOT)) for p in PACKAGE_ROOT.rglob("*") if p.is_dir() and p.name in dir(builtins))
  assert not shadowing, shadowing


def test_the_package_has_no_import_cycle():
  edges = graph()
  assert len(edges) > 40, f"expected the mlm_jax package at {PACKAGE_ROOT}"
  found = cycles(edges)
  assert not found, "import cycles in mlm_jax/:\n" + "\n".join(describe(c, edges) for c in found)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
  """The checker itself: a planted cycle (one import inside a function, one relative) is named."""
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from pkg.sub import b\n")
  (pkg / "sub" / "b.py").write_text("def f():\n  from .. import c\n")
  (pkg / "c.py").write_text("import pkg.a\n")
  (pkg / "leaf.py").write_text("from pkg import a\n")
  edges = graph(pkg)
  assert cycles(edges) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
  assert describe(cycles(edges)[0], edges) == "3 modules: pkg.a -> pkg.sub.b; pkg.c -> pkg.a; pkg.sub.b -> pkg.c"

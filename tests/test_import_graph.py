"""No import cycle in mlm_jax/: the package's import graph, read from source with `ast`.

Arrows must point down (binaries -> loop/step -> objectives -> model/masking -> leaf helpers). A
cycle, even through an import inside a function, means two modules are one concept split in two or
a leaf reaches up. The failure names every cycle and the imports that close it.
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

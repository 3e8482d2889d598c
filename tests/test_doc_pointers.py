"""Pointers in code, configs and docs lead somewhere: every named repo file exists, every docs anchor is a heading."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("mlm_jax", "tools", "configs", "docs", "launch")
# A path written from the repository root: mlm_jax/..., tools/..., configs/..., docs/..., launch/...
PATH = re.compile(r"(?<![\w./$-])((?:mlm_jax|tools|configs|docs|launch)/[\w./-]*\w\.(?:py|md|sh|sbatch))\b")
ANCHOR = re.compile(r"(?<![\w./-])(?:docs/)?([\w]+\.md)#([\w-]+)")
PLACEHOLDERS = ("TASK.py", "NAME.py")   # configs/finetune/TASK.py stands for any task's config


def _files():
  for top in SCANNED:
    for p in sorted((ROOT / top).rglob("*")):
      if p.suffix in (".py", ".md", ".sh", ".sbatch") and "__pycache__" not in p.parts:
        yield p


def _slug(heading: str) -> str:
  """GitHub's anchor for a markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", page.read_text(), re.M)}


def test_named_files_exist():
  missing = [f"{p.relative_to(ROOT)}: {m.group(1)}" for p in _files() for m in PATH.finditer(p.read_text())
             if not m.group(1).endswith(PLACEHOLDERS) and not (ROOT / m.group(1)).exists()]
  assert not missing, "pointers to files that do not exist:\n" + "\n".join(missing)


def test_docs_anchors_are_headings():
  anchors = {p.name: _anchors(p) for p in (ROOT / "docs").glob("*.md")}
  bad = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _files() for m in ANCHOR.finditer(p.read_text())
         if m.group(1) in anchors and m.group(2) not in anchors[m.group(1)]]
  assert not bad, "anchors that name no heading:\n" + "\n".join(bad)

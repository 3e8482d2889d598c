"""Every command the documentation shows starts: each `python -m mlm_jax.X` and `python tools/X.py [sub]`
in README.md, docs/, configs/ and launch/ answers --help (its usage or flags printed, no traceback), so a renamed or
moved module cannot leave a documented command behind."""
import re
import subprocess
import sys

from subproc import REPO, cpu_env

COMMAND = re.compile(r"python3? (-m (mlm_jax(?:\.[a-z_]+)+)|(tools/[a-z_]+\.py)(?: (train|input|mlm|to_hf|from_hf)\b)?)")
# Run by the code, not by users: the token store's batch worker reads pickled requests on stdin.
INTERNAL = {"mlm_jax.data.store.batch"}


def documented_commands() -> list[tuple[str, ...]]:
  texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "configs").rglob("*.py")),
           *sorted((REPO / "launch").iterdir())]
  found = set()
  for path in texts:
    for m in COMMAND.finditer(path.read_text(encoding="utf-8")):
      if m.group(2):
        if m.group(2) not in INTERNAL:
          found.add(("-m", m.group(2)))
      else:
        found.add((m.group(3),) + ((m.group(4),) if m.group(4) else ()))
  return sorted(found)


def test_every_documented_command_answers_help():
  commands = documented_commands()
  assert ("-m", "mlm_jax.train") in commands and ("tools/aot_compile.py",) in commands, commands
  procs = [(c, subprocess.Popen([sys.executable, *c, "--help"], cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)) for c in commands]
  failed = []
  for c, p in procs:
    out, _ = p.communicate(timeout=300)
    # argparse exits 0 after its usage; absl prints the module's flags and exits 1
    if p.returncode not in (0, 1) or "Traceback" in out or "usage" not in out.lower() and "flags:" not in out:
      failed.append(f"python {' '.join(c)} --help: exit {p.returncode}: {out[-400:]}")
  assert not failed, "\n".join(failed)

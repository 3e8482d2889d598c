"""The downstream suite's table and JSON: per task mean ± std over seeds, the average of each group
(fine-tuning, zero-shot), zero-shot cross-lingual columns, BLiMP's phenomena beside the paper's rows, and
CLAMS's and a user's pairs per phenomenon and language (or file).

Scores are percentages of each task's standard metric, averaged unweighted over tasks, as a GLUE table
does; how the cross-lingual means are taken: docs/design_notes.md#finetuner-suite-suite_report.
"""
from __future__ import annotations

import numpy as np

METRIC_NAMES = dict(accuracy="acc", macro_f1="macro-F1", f1="F1", token_accuracy="acc")


def _mean_std(values: list) -> tuple[float, float]:
  v = np.asarray(values, np.float64) * 100
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def _mean(values) -> float | None:
  values = list(values)
  return float(np.mean(values)) if values else None


def summarize_task(task, results: list, seen: list) -> dict:
  """One task's row from its per-seed records (suite.run_one)."""
  mean, std = _mean_std([r["score"] for r in results])
  row = dict(metric=task.metric, mean=mean, std=std, seeds=[r["seed"] for r in results],
             scores=[100 * r["score"] for r in results], seconds=sum(r["seconds"] for r in results))
  if task.also:
    row[task.also] = _mean_std([r["scores"][task.also] for r in results])[0]
  langs = sorted({lang for r in results for lang in r["crosslingual"]})
  if langs:
    per = {lang: 100 * float(np.mean([r["crosslingual"][lang] for r in results])) for lang in langs}
    row["crosslingual"] = per
    row["crosslingual_seen_mean"] = _mean(v for k, v in per.items() if k in seen)
    row["crosslingual_other_mean"] = _mean(v for k, v in per.items() if k not in seen)
  return row


def summarize(tasks: list, results: dict, info: dict, zeroshot: dict | None = None) -> dict:
  """The JSON: run info, per task rows, the average over fine-tuning tasks (of the per-task means), and
  the zero-shot tasks' results (BLiMP: overall, phenomena, every paradigm) with their average."""
  rows = {t.name: summarize_task(t, results[t.name], info["pretrain_languages"]) for t in tasks}
  zeroshot = zeroshot or {}
  return dict(info, tasks=rows, average=_mean(r["mean"] for r in rows.values()), zeroshot=zeroshot,
              zeroshot_average=_mean(100 * z["overall"] for z in zeroshot.values()))


def _cell(value, std=None) -> str:
  if value is None:
    return "-"
  return f"{value:.1f}" if std is None else f"{value:.1f} ± {std:.1f}"


def _time(seconds: float) -> str:
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _too_long(z: dict) -> str:
  n = z.get("too_long", 0)
  return f"; {n} longer than the model's {z['longest']} tokens, counted wrong" if n else ""


def _pll(z: dict) -> str:
  return z.get("pll", "token")   # kept before --pll existed: token


def _dtype(z: dict) -> str:
  return f" in {z['dtype']}" if "dtype" in z else ""   # the compute dtype that scored (kept before: not recorded)


def main_table(summary: dict) -> list[str]:
  lines = [f"{'task':<15}{'metric':<10}{'score (mean ± std)':>20}{'seeds':>7}{'time':>10}"]
  for name, row in summary["tasks"].items():
    metric = METRIC_NAMES.get(row["metric"], row["metric"])
    extra = f"  (EM {row['exact_match']:.1f})" if "exact_match" in row else ""
    lines.append(f"{name:<15}{metric:<10}{_cell(row['mean'], row['std']):>20}{len(row['seeds']):>7}"
                 f"{_time(row['seconds']):>10}{extra}")
  if summary["tasks"]:
    lines.append(f"{'average (fine-tuning)':<25}{_cell(summary['average']):>20}   ({len(summary['tasks'])} tasks)")
  zeroshot = summary.get("zeroshot") or {}
  for name, z in zeroshot.items():
    lines.append(f"{name:<15}{'acc':<10}{_cell(100 * z['overall']):>20}{'-':>7}{_time(z['seconds']):>10}"
                 f"  (zero-shot, {z['pairs']} pairs, {_pll(z)} PLL{_dtype(z)}{_too_long(z)})")
  if zeroshot:
    lines.append(f"{'average (zero-shot)':<25}{_cell(summary['zeroshot_average']):>20}   ({len(zeroshot)} tasks)")
  return lines


def blimp_table(summary: dict) -> list[str]:
  """BLiMP per phenomenon (mean over its paradigms) and overall (mean over paradigms), beside the paper's rows."""
  z = (summary.get("zeroshot") or {}).get("blimp")
  if not z:
    return []
  published = z.get("published") or {}
  rows = list(published)
  lines = [f"{'phenomenon':<36}{'this model':>11}" + "".join(f"{r:>16}" for r in rows)]
  for term, acc in list(z["phenomena"].items()) + [("overall", z["overall"])]:
    cells = "".join(f"{_cell(100 * published[r][term]) if term in published[r] else '-':>16}" for r in rows)
    lines.append(f"{term:<36}{_cell(100 * acc):>11}{cells}")
  return lines


GROUP_COLUMNS = 10   # groups (languages, files) side by side; more continue in another block


def pairs_table(name: str, z: dict) -> list[str]:
  """A zero-shot task other than BLiMP: per phenomenon (rows) and language or file (columns) with each one's
  mean (over its phenomena); without groups, per phenomenon; then the overall accuracy."""
  what = f"zero-shot {name} ({_pll(z)} pseudo-log-likelihood{_dtype(z)}, a tie is wrong; {z['pairs']} pairs"
  groups = z.get("groups")
  if not groups:
    terms = {t: a for t, a in z["phenomena"].items() if t}
    lines = [what + ")", f"{'phenomenon':<36}{'accuracy':>9}"] if terms else [what + ")"]
    return lines + [f"{t:<36}{_cell(100 * a):>9}" for t, a in terms.items()] + [f"{'overall':<36}{_cell(100 * z['overall']):>9}"]
  lines = [what + f"; the mean of a {z.get('group') or 'group'} over its phenomena, overall over "
           f"{z.get('group') or 'group'}s: {_cell(100 * z['overall'])})"]
  names = list(groups)
  terms = sorted({t for g in names for t in z["by_group"][g]})
  width = max([len(t) for t in terms] + [10]) + 2
  for at in range(0, len(names), GROUP_COLUMNS):
    block = names[at:at + GROUP_COLUMNS]
    cols = max([len(g) for g in block] + [5]) + 2
    lines.append(f"{'phenomenon':<{width}}" + "".join(f"{g:>{cols}}" for g in block))
    for t in terms:
      cells = (z["by_group"][g].get(t) for g in block)
      lines.append(f"{t or '(all)':<{width}}" + "".join(f"{_cell(None if c is None else 100 * c):>{cols}}"
                                                         for c in cells))
    lines.append(f"{'mean':<{width}}" + "".join(f"{_cell(100 * groups[g]):>{cols}}" for g in block))
  return lines


def crosslingual_table(summary: dict) -> list[str]:
  rows = {n: r for n, r in summary["tasks"].items() if "crosslingual" in r}
  if not rows:
    return []
  seen = summary["pretrain_languages"]
  langs = sorted({lang for r in rows.values() for lang in r["crosslingual"]})
  head = f"{'task':<10}{'en':>7}" + "".join(f"{lang + ('*' if lang in seen else ''):>7}" for lang in langs)
  lines = [head + f"{'pretrained':>12}{'others':>9}"]
  for name, r in rows.items():
    cells = "".join(f"{_cell(r['crosslingual'].get(lang)):>7}" for lang in langs)
    lines.append(f"{name:<10}{_cell(r['mean']):>7}{cells}{_cell(r['crosslingual_seen_mean']):>12}"
                 f"{_cell(r['crosslingual_other_mean']):>9}")
  return lines


def _header(summary: dict) -> str:
  """The run's line: the model, and the fine-tuning mode and seeds only where tasks were fine-tuned."""
  tuned = f"  mode={summary['mode']}  seeds={summary['num_seeds']}" if summary["tasks"] else "  (zero-shot only)"
  return f"downstream suite: {summary['init_from']}{tuned}{'  RANDOM INIT' if summary['random_init'] else ''}"


def format_table(summary: dict) -> str:
  """The printed report: a header, the task table and the zero-shot table."""
  head = _header(summary)
  lines = [head, ""] + main_table(summary)
  bl = blimp_table(summary)
  if bl:
    pairs = summary["zeroshot"]["blimp"]["pairs"]
    blimp = summary["zeroshot"]["blimp"]
    lines += ["", f"zero-shot BLiMP ({_pll(blimp)} pseudo-log-likelihood{_dtype(blimp)}, a tie is wrong; "
                  f"{pairs} pairs; the paper's rows: all 67,000 pairs)"] + bl
  for name, z in (summary.get("zeroshot") or {}).items():
    if name != "blimp":
      lines += [""] + pairs_table(name, z)
  xl = crosslingual_table(summary)
  if xl:
    seen = summary["pretrain_languages"]
    lines += ["", f"zero-shot cross-lingual (fine-tuned on en; same metric; * = pretrained on, from "
                  f"{summary['pretrain_languages_from']}: {', '.join(seen) or 'none known'})"] + xl
  return "\n".join(lines)


def _scores(summary: dict) -> dict:
  """{row: (label, score in %)}: each task's mean, each zero-shot task's overall and its languages or files
  (CLAMS, pairs of several files), else its phenomena (BLiMP, pairs of one file)."""
  out = {name: (METRIC_NAMES.get(r["metric"], r["metric"]), r["mean"]) for name, r in summary["tasks"].items()}
  if summary["tasks"]:
    out["average (fine-tuning)"] = ("", summary["average"])
  for name, z in (summary.get("zeroshot") or {}).items():
    out[name] = ("acc", 100 * z["overall"])
    parts = z.get("groups") or {t: a for t, a in z.get("phenomena", {}).items() if t}
    out.update({f"  {name}/{part}" if name != "blimp" else f"  {part}": ("acc", 100 * acc)
                for part, acc in parts.items()})
  return out


def comparison_table(model: dict, baseline: dict) -> str:
  """The model beside its own random init (`--baseline`): per task and BLiMP phenomenon, both scores and
  the gain in points; the reader sees at once where pretraining helped at this budget and where not."""
  a, b = _scores(model), _scores(baseline)
  lines = [_header(model), f"beside: the same architecture and tokenizer with random weights, same budgets", "",
           f"{'task':<36}{'metric':<10}{'model':>8}{'random init':>13}{'gain':>8}"]
  for name, (metric, score) in a.items():
    base = b.get(name, ("", None))[1]
    gain = "-" if score is None or base is None else f"{score - base:+.1f}"
    lines.append(f"{name:<36}{metric:<10}{_cell(score):>8}{_cell(base):>13}{gain:>8}")
  return "\n".join(lines)

"""Line coverage of the package before and after a reorganisation, by module, and whether every function the
old tests ran is still run: from two `coverage json` reports (coverage.py 7.5 or later, which reports
functions). A module is followed to where most of its functions went (by qualified name); a function the old
tests ran is "still run" where a function of the same qualified name in the new package runs, "not run" where it
exists and runs no line, "gone" where no function has its name any more (removed or renamed).

    python scripts/dev/coverage_moves.py before.json after.json

How the reports were made (issue 41: the house's moves): docs/development.md, "Coverage before and after".
Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def module(path: str) -> str:
    """`.../autotune/trial/loop.py` -> `autotune.trial.loop`."""
    parts = Path(path).with_suffix("").parts
    parts = parts[len(parts) - 1 - parts[::-1].index("autotune") :]
    return ".".join(p for p in parts if p != "__init__")


def load(path: str) -> dict[str, dict]:
    """Per module: its statements, covered lines, and its functions (qualified name -> lines run)."""
    files = json.loads(Path(path).read_text())["files"]
    out = {}
    for name, f in files.items():
        out[module(name)] = {
            "statements": f["summary"]["num_statements"],
            "covered": f["summary"]["covered_lines"],
            "functions": {q: fn["summary"]["covered_lines"] for q, fn in f.get("functions", {}).items() if q},
        }
    return out


def main() -> None:
    before, after = load(sys.argv[1]), load(sys.argv[2])
    where: dict[str, list[str]] = {}  # qualified name -> the new modules that define it
    for mod, m in after.items():
        for q in m["functions"]:
            where.setdefault(q, []).append(mod)
    rows, gone, not_run, still, ran_before = [], [], [], 0, 0
    for mod, m in sorted(before.items()):
        went = Counter(w for q in m["functions"] for w in where.get(q, []))
        new = went.most_common(1)[0][0] if went else None
        for q, lines in m["functions"].items():
            if not lines:
                continue
            ran_before += 1
            homes = where.get(q, [])
            if not homes:
                gone.append(f"{mod}.{q}")
            elif any(after[h]["functions"][q] for h in homes):
                still += 1
            else:
                not_run.append(f"{mod}.{q} -> {', '.join(homes)}")
        a = after.get(new) if new else None
        rows.append((mod, m, new, a))
    print(
        f"{'module before':32} {'stmts':>6} {'cov':>6}   {'module after (most of its functions)':40} {'stmts':>6} {'cov':>6}"
    )
    for mod, m, new, a in rows:
        pct = 100 * m["covered"] / m["statements"] if m["statements"] else 100.0
        right = f"{new:40} {a['statements']:6d} {100 * a['covered'] / max(a['statements'], 1):5.1f}%" if a else "-"
        print(f"{mod:32} {m['statements']:6d} {pct:5.1f}%   {right}")
    totals = {
        k: {"statements": sum(m["statements"] for m in d.values()), "covered": sum(m["covered"] for m in d.values())}
        for k, d in (("before", before), ("after", after))
    }
    for k, t in totals.items():
        print(f"{k}: {t['covered']} of {t['statements']} statements ({100 * t['covered'] / t['statements']:.1f}%)")
    print(
        f"functions the old tests ran: {ran_before}; still run: {still}; not run now: {len(not_run)}; "
        f"gone (no function of that name): {len(gone)}"
    )
    for line in not_run:
        print(f"  not run now: {line}")
    for line in gone:
        print(f"  gone: {line}")
    summary = {
        "totals": totals,
        "functions_ran_before": ran_before,
        "still_run": still,
        "not_run_now": not_run,
        "gone": gone,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

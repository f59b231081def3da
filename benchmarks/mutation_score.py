"""Mutation score of the modules mutmut has run on (reads mutants/pdsim/*.py.meta; `make mutate-sample`).

Prints per module: mutants checked, killed (incl. timeouts), survived, not yet checked, and the
score killed / checked.  A time-boxed run leaves some mutants unchecked: the score is over the
checked ones and says how many that is.  Run: .venv/bin/python benchmarks/mutation_score.py [MODULE...]
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# mutmut 3's exit codes (mutmut/stats.py)
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
SURVIVED = {0}
NO_TESTS = {5, 33}


def score(meta: Path) -> dict:
    codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
    c = Counter({"killed": 0, "survived": 0, "no_tests": 0, "unchecked": 0, "other": 0})
    survivors = []
    for key, code in codes.items():
        if code is None:
            c["unchecked"] += 1
        elif code in KILLED:
            c["killed"] += 1
        elif code in SURVIVED:
            c["survived"] += 1
            survivors.append(key)
        elif code in NO_TESTS:
            c["no_tests"] += 1
        else:
            c["other"] += 1
    checked = c["killed"] + c["survived"] + c["no_tests"]
    return {"total": len(codes), "checked": checked, **c,
            "score": c["killed"] / checked if checked else None, "survivors": sorted(survivors)}


def main(modules: list[str]) -> None:
    metas = sorted((REPO / "mutants" / "pdsim").glob("*.py.meta"))
    if modules:
        metas = [m for m in metas if m.name.removesuffix(".py.meta") in modules]
    if not metas:
        print("no mutmut results under mutants/: run `make mutate-sample` first")
        return
    for m in metas:
        s = score(m)
        if not s["checked"]:
            continue
        print(f"pdsim/{m.name.removesuffix('.meta')}: {s['checked']} of {s['total']} mutants checked; "
              f"killed {s['killed']}, survived {s['survived']}, no tests {s['no_tests']}; "
              f"score {s['score']:.1%} of checked")
        for k in s["survivors"]:
            print(f"    survived: {k}   (mutmut show {k})")


if __name__ == "__main__":
    main(sys.argv[1:])

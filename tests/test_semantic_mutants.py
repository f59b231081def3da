"""The semantic-mutant catalog (benchmarks/semantic_mutants.py) stays runnable, and its runner judges
pytest's exit codes right.  Cheap: no mutant is run here (`make mutants` runs them all; `make test`
runs a time-boxed sample after the suite)."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("semantic_mutants", REPO / "benchmarks" / "semantic_mutants.py")
sm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm)


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test")}


def test_every_snippet_occurs_exactly_once_in_its_file():
    assert sm.check_catalog(REPO) == []
    for m in sm.MUTANTS:
        assert (REPO / m.file).read_text().count(m.old) == 1, m.id
        assert m.old != m.new and m.why, m.id


def test_ids_are_unique_and_the_catalog_is_not_a_token_sample():
    ids = [m.id for m in sm.MUTANTS]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 25


def test_every_test_id_names_an_existing_test_function():
    cache: dict[str, set[str]] = {}
    for m in sm.MUTANTS:
        assert m.tests and isinstance(m.tests, tuple), m.id
        for t in m.tests:
            file, sep, name = t.partition("::")
            assert sep and "::" not in name, (m.id, t)
            path = REPO / file
            assert path.is_file(), (m.id, t)
            if file not in cache:
                cache[file] = _test_functions(path)
            assert name.split("[")[0] in cache[file], (m.id, t)


@pytest.mark.parametrize("rc, outcome", [(1, "killed"), (0, "survived"), (2, "error"), (3, "error"),
                                         (4, "error"), (5, "error"), (None, "error"), (-9, "error")])
def test_pytest_exit_codes_are_classified(rc, outcome):
    # 1: a test failed (killed); 0: all passed (survived); interrupted, internal/usage errors, nothing
    # collected, killed by a signal or timed out (None) prove nothing about the tests: errors
    assert sm.classify(rc) == outcome


def test_a_stale_snippet_is_reported_by_name(tmp_path):
    (tmp_path / "pdsim").mkdir()
    (tmp_path / "pdsim" / "a.py").write_text("x = 1\ny = 1\n")
    cat = [sm.Mutant("gone", "pdsim/a.py", "x = 2", "x = 3", ("t::t",), "w"),
           sm.Mutant("twice", "pdsim/a.py", " = 1", " = 2", ("t::t",), "w"),
           sm.Mutant("ok", "pdsim/a.py", "y = 1", "y = 2", ("t::t",), "w"),
           sm.Mutant("ok", "pdsim/b.py", "y = 1", "y = 2", ("t::t",), "w")]
    errs = sm.check_catalog(tmp_path, cat)
    assert "mutant gone: snippet not found in pdsim/a.py; update the catalog" in errs
    assert any(e.startswith("mutant twice: snippet occurs 2 times") for e in errs)
    assert any("duplicate id" in e for e in errs) and any("pdsim/b.py does not exist" in e for e in errs)
    assert not any(e.startswith("mutant ok: snippet") for e in errs)


def test_apply_mutates_only_the_copy_and_refuses_a_stale_snippet(tmp_path):
    (tmp_path / "pdsim").mkdir()
    f = tmp_path / "pdsim" / "a.py"
    f.write_text("x = 1\n")
    original = sm.apply(tmp_path, sm.Mutant("m", "pdsim/a.py", "x = 1", "x = 2", ("t::t",), "w"))
    assert original == "x = 1\n" and f.read_text() == "x = 2\n"
    with pytest.raises(LookupError, match="mutant m2: snippet not found"):
        sm.apply(tmp_path, sm.Mutant("m2", "pdsim/a.py", "x = 1", "x = 3", ("t::t",), "w"))


def test_order_puts_changed_files_first_and_rotates_each_group_by_head():
    cat = [sm.Mutant(f"m{i}", f"f{i % 3}.py", "a", "b", ("t::t",), "w") for i in range(7)]
    o = sm.order(cat, {"f1.py"}, "0" * 40)                      # hash 0: no rotation
    assert [m.id for m in o] == ["m1", "m4", "m0", "m2", "m3", "m5", "m6"]
    # a hash of 7: the changed pair rotates by 7 % 2 = 1, the other five by 7 % 5 = 2; same every time
    head = "000000000007" + "f" * 28
    o = sm.order(cat, {"f1.py"}, head)
    assert [m.id for m in o] == ["m4", "m1", "m3", "m5", "m6", "m0", "m2"]
    assert o == sm.order(cat, {"f1.py"}, head)
    assert sorted(m.id for m in sm.order(cat, set(), "abc" * 13 + "d")) == sorted(m.id for m in cat)

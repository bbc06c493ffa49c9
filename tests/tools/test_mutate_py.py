"""The generated-mutant tool's machinery (tools/mutate/sample_py.py) on a small module in a temporary folder: the
mutants cosmic-ray makes are enumerated in a fixed order, a seed names one sample, applying a mutant and restoring
leaves the file byte-identical, a mutant a test should catch is killed and an equivalent one survives, and every
source file of the package maps to tests that exist. A few seconds, no network; the long run is the tool's own.

The tool is read from the checkout this file lives in, as in test_mutants.py.
"""

import importlib.util
import os

import pytest

SAMPLE_PY = os.path.join("tools", "mutate", "sample_py.py")


def _root():
    base = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # tests/tools/ -> the root
    if not os.path.isfile(os.path.join(base, SAMPLE_PY)):
        pytest.fail(f"{SAMPLE_PY} is not beside this file's tests/ (in {base})")
    return base


ROOT = _root()


def _load():
    spec = importlib.util.spec_from_file_location("infinitrain_sample_py", os.path.join(ROOT, SAMPLE_PY))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _load()

MODULE = "pkg/clamp.py"
SOURCE = """def scale(x, k):
    return x * k


def clamp(x):
    if x < 0:
        return 0
    return x
"""
TEST = """from clamp import clamp, scale


def test_scale():
    assert scale(3, 4) == 12


def test_clamp():
    assert clamp(-2) == 0 and clamp(5) == 5
"""
KILLED = f"{MODULE}:ReplaceBinaryOperator_Mul_Add:0"  # 3 + 4 != 12
EQUIVALENT = f"{MODULE}:ReplaceComparisonOperator_Lt_LtE:0"  # x <= 0 also returns 0 for x == 0


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / MODULE).write_text(SOURCE)
    (tmp_path / "tests" / "test_clamp.py").write_text(TEST)
    yield tmp_path
    S.restore_all()


def _mutants():
    return S.enumerate_mutants({MODULE: SOURCE})


def test_enumeration_is_fixed_and_covers_the_operators():
    ms = _mutants()
    ids = [m["id"] for m in ms]
    assert ids == [m["id"] for m in _mutants()]
    assert len(ids) == len(set(ids))
    assert KILLED in ids and EQUIVALENT in ids
    assert {m["op"].split("/")[1].split("_")[0] for m in ms} >= {"ReplaceBinaryOperator", "NumberReplacer"}
    assert all(m["line"] in range(1, SOURCE.count("\n") + 1) for m in ms)


def test_the_seed_names_the_sample():
    ms = _mutants()
    a = S.sample(ms, 20261205, 10)
    assert [m["id"] for m in a] == [m["id"] for m in S.sample(ms, 20261205, 10)]
    assert [m["id"] for m in a] != [m["id"] for m in S.sample(ms, 1, 10)]
    assert len({m["id"] for m in a}) == 10 and all(m in ms for m in a)
    assert len(S.sample(ms, 0, 10**6)) == len(ms)


def test_apply_changes_the_file_and_restore_is_byte_identical(tree):
    before = (tree / MODULE).read_bytes()
    for m in _mutants():
        diff, why = S.apply(str(tree), m, SOURCE)
        if why:  # an operator may make no change at a position: then nothing is written
            assert (tree / MODULE).read_bytes() == before
            continue
        now = (tree / MODULE).read_text()
        assert now != SOURCE and now == S.mutated_text(SOURCE, m)
        assert diff.startswith("@@") and any(line.startswith("+") for line in diff.splitlines())
        S.restore_all()
        assert (tree / MODULE).read_bytes() == before, m["id"]


def test_a_file_changed_since_the_commit_is_not_mutated(tree):
    (tree / MODULE).write_text(SOURCE + "# edited\n")
    diff, why = S.apply(str(tree), _mutants()[0], SOURCE)
    assert diff is None and "differs" in why
    assert (tree / MODULE).read_text() == SOURCE + "# edited\n"


def test_restore_keeps_an_edit_made_meanwhile(tree):
    S.apply(str(tree), _mutants()[0], SOURCE)
    (tree / MODULE).write_text("someone else's edit\n")
    S.restore_all()
    assert (tree / MODULE).read_text() == "someone else's edit\n"
    assert (tree / (MODULE + ".unmutated")).read_text() == SOURCE


def test_a_caught_mutant_is_killed_and_an_equivalent_one_survives(tree):
    by_id = {m["id"]: m for m in _mutants()}
    tests_root = str(tree / "tests")
    env = dict(os.environ, PYTHONPATH=str(tree / "pkg"))
    why, failing, _ = S.run_baseline(["test_clamp.py"], tests_root, env, 60, None)
    assert why is None and failing == []
    results = {}
    for mid in (KILLED, EQUIVALENT):
        res = S.run_one(by_id[mid], str(tree), SOURCE, ["test_clamp.py"], tests_root, env, 60, None)
        assert (tree / MODULE).read_text() == SOURCE
        results[mid] = res
    assert results[KILLED]["result"] == "killed", results[KILLED]
    assert "test_scale" in results[KILLED]["detail"]
    assert results[EQUIVALENT]["result"] == "survived", results[EQUIVALENT]
    assert "-    if x < 0:" in results[EQUIVALENT]["diff"] and "+    if x <= 0:" in results[EQUIVALENT]["diff"]
    s = S.summary(list(results.values()), {EQUIVALENT})
    assert (s["killed"], s["survived"], s["equivalent"], s["score"]) == (1, 1, 1, 1.0)


def test_every_source_file_maps_to_tests_that_exist():
    pkg = os.path.join(ROOT, S.PKG)
    tests_root = os.path.join(ROOT, "tests")
    for area, tests in S.AREAS.items():
        for t in tests:
            assert os.path.exists(os.path.join(tests_root, t)), f"AREAS[{area!r}] names {t}, which does not exist"
    for base, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(base, f), ROOT)
                assert S.area_tests(rel, tests_root), f"{rel} maps to no existing test"

"""The mutation tool's mutants still apply (tools/mutate/mutants.py): each one's `old` snippet occurs exactly once
in its file and every test file it names exists, so a refactoring that moves the code a mutant targets fails here,
in the suite, instead of leaving the mutant out of the next mutation report.

The files are read from the checkout this file lives in (the Bazel target, //tests/tools:test_mutants from the tests/
glob, reaches it through its runfiles link; the kernels' package does not export its sources as data). So Bazel
reruns it when this file, the package's Python or the core library changes, not for a change to mutants.py or a
test file alone: mutate.py makes the same checks itself and exits 1 on an invalid mutant.
"""

import importlib.util
import os

import pytest

MUTANTS_PY = os.path.join("tools", "mutate", "mutants.py")


def _root():
    base = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # tests/tools/ -> the root
    if not os.path.isfile(os.path.join(base, MUTANTS_PY)):
        pytest.fail(f"{MUTANTS_PY} is not beside this file's tests/ (in {base})")
    return base


ROOT = _root()


def _load():
    spec = importlib.util.spec_from_file_location("infinitrain_mutants", os.path.join(ROOT, MUTANTS_PY))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MUTANTS = _load().MUTANTS


def test_mutant_ids_are_unique_and_each_mutant_changes_something():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(MUTANTS) >= 40, f"only {len(MUTANTS)} mutants: were some dropped?"
    for m in MUTANTS:
        assert m.old != m.new, f"{m.id}: the replacement equals the snippet"
        assert m.tests, f"{m.id}: no tests named"


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.id)
def test_mutant_applies_once(m):
    path = os.path.join(ROOT, m.path)
    assert os.path.isfile(path), f"{m.id}: {m.path} does not exist"
    with open(path) as f:
        n = f.read().count(m.old)
    assert n == 1, f"{m.id} ({m.note}): its snippet occurs {n} times in {m.path}; update tools/mutate/mutants.py"


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.id)
def test_mutant_tests_exist(m):
    missing = [t for t in m.tests if not os.path.isfile(os.path.join(ROOT, t.split("::")[0]))]
    assert not missing, f"{m.id} ({m.note}) names test files that do not exist: {missing}"


def test_train_mutants_run_the_flag_effect_suites():
    """The train-CLI mutants run every suite that checks the CLI's flags by their effect (the flag-effect tests
    moved to test_train_flag_effects.py; a mutant without it survives what those tests would kill)."""
    train_mutants = [m for m in MUTANTS if m.path.startswith("python/infinitrain/training/")]
    assert train_mutants
    for m in train_mutants:
        for suite in (
            "tests/train/test_train.py",
            "tests/train/test_train_flags.py",
            "tests/train/test_train_flag_effects.py",
        ):
            assert suite in m.tests, f"{m.id} does not run {suite}"

"""The C++ kernel mutant generator (tools/mutate/sample_cc.py) on a small source text: only spaced binary operators
and integer literals in code are mutated (not template brackets, pointers, unary minus, floats, strings, comments,
preprocessor lines or registrations), a mutant changes exactly one token, the enumeration is fixed, and every CPU
kernel file maps to op suites that exist. No build: the long run is the tool's own.

The tool is read from the checkout this file lives in, as in test_mutate_py.py."""

import importlib.util
import os
import sys

import pytest

SAMPLE_CC = os.path.join("tools", "mutate", "sample_cc.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _load():
    if not os.path.isfile(os.path.join(ROOT, SAMPLE_CC)):
        pytest.fail(f"{SAMPLE_CC} is not beside this file's tests/ (in {ROOT})")
    sys.path.insert(0, os.path.join(ROOT, "tools", "mutate"))
    spec = importlib.util.spec_from_file_location("infinitrain_sample_cc", os.path.join(ROOT, SAMPLE_CC))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C = _load()

SOURCE = """#include <vector>  // a + b
// n < 2 in a comment
/* a block
   x * y */
std::vector<float> v;
float f(const float* p, int n) {
    float s = -p[0] * 1.5f;
    for (int i = 1; i < n; ++i) s += p[i];
    OpError("op", "n + 1 in a message");
    const char* t = "a && b";
    return n >= 8 && s != 0.0f ? s : 2.0;
}
REGISTER_KERNEL(DeviceType::kCPU, "f", F);
"""


def test_only_code_tokens_are_mutated():
    ms = C.enumerate_mutants({"k.cc": SOURCE})
    got = {(m["line"], m["old"], m["new"]) for m in ms}
    assert got == {
        (7, "*", "/"),  # -p[0] * 1.5f: the product, not the pointer or the unary minus; 1.5f is a float
        (7, "0", "1"),
        (8, "1", "2"),
        (8, "1", "0"),
        (8, "<", "<="),
        (8, "+=", "-="),
        (11, ">=", ">"),
        (11, "8", "9"),
        (11, "&&", "||"),
        (11, "!=", "=="),
    }
    assert [m["id"] for m in ms] == [m["id"] for m in C.enumerate_mutants({"k.cc": SOURCE})]


def test_a_mutant_changes_one_token():
    for m in C.enumerate_mutants({"k.cc": SOURCE}):
        new = C.mutated_text(SOURCE, m)
        a, b = SOURCE.splitlines(), new.splitlines()
        changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        assert changed == [m["line"] - 1]
        assert b[m["line"] - 1].replace(m["new"], m["old"], 1) == a[m["line"] - 1] or m["old"] in a[m["line"] - 1]


def test_every_kernel_file_has_tests():
    files = sorted(f for f in os.listdir(os.path.join(ROOT, C.KERNELS)) if f.endswith(".cc"))
    assert sorted(C.AREAS) == files
    for f, tests in C.AREAS.items():
        for t in tests + C.COMMON:
            assert os.path.exists(os.path.join(ROOT, "tests", t)), (f, t)

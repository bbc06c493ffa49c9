"""Unary functions of integer tensors follow PyTorch's rule, checked against NumPy: neg and abs stay integer and
exact (beyond float32's 24 bits too), the others compute in float32. The generated-mutant sample
(docs/mutation_python.md) found the rule could be inverted (neg through float32, exp kept integer) with the core
suites passing: they check these functions on floating inputs only."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE

VALUES = [-(2**40) - 1, -7, -1, 0, 1, 3, 2**40 + 1]  # 2**40 + 1 is not a float32


@pytest.mark.parametrize("name", ["neg", "abs"])
def test_neg_and_abs_of_int64_stay_integer_and_exact(name):
    x = np.array(VALUES, dtype=np.int64)
    got = getattr(it, name)(it.as_tensor(x, device=DEVICE))
    assert got.dtype == "int64"
    np.testing.assert_array_equal(got.numpy(), getattr(np, "negative" if name == "neg" else "abs")(x))


@pytest.mark.parametrize("name", ["exp", "sqrt"])
def test_other_unary_functions_of_integers_compute_in_float32(name):
    x = np.array([0, 1, 2, 3, 9], dtype=np.int64)
    got = getattr(it, name)(it.as_tensor(x, device=DEVICE))
    assert got.dtype == "float32"
    np.testing.assert_allclose(got.numpy(), getattr(np, name)(x.astype(np.float64)), rtol=1e-6)

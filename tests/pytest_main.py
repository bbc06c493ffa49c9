"""Entry point of every py_test: runs pytest on the test file given as the first argument.

--omp-threads=N runs the file with N OpenMP threads (the op suites run at 1, the machine's count and 8, so every
parallel split is exercised whatever the machine). The OpenMP runtime reads OMP_NUM_THREADS once, when it loads
with the core library, so it is set here, before anything imports infinitrain.
"""

import os
import sys

import pytest

if __name__ == "__main__":
    target, rest = sys.argv[1], []
    for arg in sys.argv[2:]:
        if arg.startswith("--omp-threads="):
            os.environ["OMP_NUM_THREADS"] = arg.split("=", 1)[1]
            os.environ["OMP_WAIT_POLICY"] = "passive"  # more threads than cores: waiting threads must not spin
        else:
            rest.append(arg)
    # -rs: the log lists every skipped test with its reason (.ci/run sums them up).
    # The rootdir is tests/ (this file's folder), whose conftest.py every suite shares.
    args = [target, "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", os.path.dirname(os.path.abspath(__file__))]
    code = pytest.main(args + rest)
    # A shard may hold no tests of a small file: nothing collected is a pass there.
    if code == pytest.ExitCode.NO_TESTS_COLLECTED and int(os.environ.get("TEST_TOTAL_SHARDS", "1")) > 1:
        code = 0
    sys.exit(code)

"""Entry point of every py_test: runs pytest on the test file given as the first argument."""

import os
import sys

import pytest

if __name__ == "__main__":
    target = sys.argv[1]
    args = [target, "-q", "-p", "no:cacheprovider", "--rootdir", os.path.dirname(os.path.abspath(target))]
    sys.exit(pytest.main(args + sys.argv[2:]))

"""infinitrain_py_test: one pytest file as a py_test that runs on the device under test."""

def infinitrain_py_test(name, src, size = "medium", tags = [], data = [], deps = [], shard_count = None, args = [], env = {}):
    native.py_test(
        name = name,
        srcs = [src, "pytest_main.py"],
        main = "pytest_main.py",
        args = ["$(location %s)" % src] + args,
        data = data + ["conftest.py", "harness.py", "numpy_models.py", "//docs:ops.md"],
        deps = ["//python:infinitrain"] + deps,
        size = size,
        tags = tags,
        shard_count = shard_count,
        python_version = "PY3",
        srcs_version = "PY3",
        env = env,
    )

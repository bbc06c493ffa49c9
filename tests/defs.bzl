"""The shared suites' rules: one py_test per test file, run by pytest on the device the build config selects."""

def infinitrain_py_test(name, src, size = "medium", tags = [], data = [], deps = [], shard_count = None, args = [], env = {}):
    native.py_test(
        name = name,
        srcs = [src, "//tests:pytest_main.py"],
        main = "//tests:pytest_main.py",
        args = ["$(location %s)" % src] + args,
        data = data + ["//tests:support"],
        deps = ["//python:infinitrain"] + deps,
        size = size,
        tags = tags,
        shard_count = shard_count,
        python_version = "PY3",
        srcs_version = "PY3",
        env = env,
    )

def suites(data = {}, deps = {}, shards = {}, large = []):
    """A py_test for every test_*.py file of the calling package; data, deps and shards (shard_count) by file
    name, large: files that get the large size's timeout. `:sources` is the files themselves."""
    files = native.glob(["test_*.py"])
    for src in files:
        infinitrain_py_test(
            name = src[:-3],
            src = src,
            size = "large" if src in large else "medium",
            shard_count = shards.get(src),
            data = data.get(src, []),
            deps = deps.get(src, []),
        )
    native.filegroup(name = "sources", srcs = files, visibility = ["//tests:__subpackages__"])

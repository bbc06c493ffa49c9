"""Repository rule: the project venv's Python, its C headers and pybind11.

The interpreter is $INFINITRAIN_PYTHON (./bazelw sets it to .venv/bin/python3),
else <workspace>/.venv/bin/python3. Nothing is downloaded.
"""

_BUILD = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{interpreter}",
    python_version = "PY3",
    # The launcher stub runs under the same interpreter (no `python` need be on PATH).
    stub_shebang = "#!{interpreter}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

_PROBE = """
import sys, sysconfig, pybind11
print(sysconfig.get_paths()["include"])
print(pybind11.get_include())
print("cp%d%d" % sys.version_info[:2])
"""

def _local_python_impl(rctx):
    python = rctx.os.environ.get("INFINITRAIN_PYTHON", "")
    if not python:
        python = str(rctx.path(Label("//:WORKSPACE")).dirname) + "/.venv/bin/python3"
    if not rctx.path(python).exists:
        fail("no Python at %s: run the build through ./bazelw, which creates .venv" % python)
    res = rctx.execute([python, "-c", _PROBE])
    if res.return_code != 0:
        fail("%s cannot import pybind11 (%s): run ./bazelw to install requirements.txt" % (python, res.stderr.strip()))
    include, pybind_include, tag = res.stdout.strip().split("\n")
    rctx.symlink(include, "python_include")
    rctx.symlink(pybind_include, "pybind11_include")
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD.bazel", _BUILD.format(interpreter = python))
    # The wheel's Python tag (//python:wheel).
    rctx.file("defs.bzl", "PYTHON_TAG = \"%s\"\n" % tag)

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["INFINITRAIN_PYTHON"],
    local = True,
)

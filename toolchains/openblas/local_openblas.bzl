"""Repository rule: OpenBLAS from the scipy-openblas32 wheel in the project venv (requirements.txt).

Debian's OpenBLAS 0.3.21 does not recognise current Intel CPUs and falls back to SSE3 kernels; the wheel's
is a recent DYNAMIC_ARCH build (docs/decisions.md, "CPU speed"). Its symbols carry a scipy_ prefix
(scipy_cblas_sgemm); infinitrain/kernels/cpu/blas.h names them. Nothing is downloaded: ./bazelw installed it.
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

# The library's soname is libscipy_openblas.so; the Python package preloads it from the venv
# (infinitrain/__init__.py), and Bazel's runfiles find it through the rpath it adds.
cc_library(
    name = "openblas",
    srcs = ["lib/libscipy_openblas.so"],
    hdrs = glob(["include/scipy_openblas/*.h"]),
    includes = ["include"],
)
"""

_PROBE = """
import scipy_openblas32 as s
print(s.get_include_dir())
print(s.get_lib_dir())
"""

def _local_openblas_impl(rctx):
    python = rctx.os.environ.get("INFINITRAIN_PYTHON", "")
    if not python:
        python = str(rctx.path(Label("//:WORKSPACE")).dirname) + "/.venv/bin/python3"
    res = rctx.execute([python, "-c", _PROBE])
    if res.return_code != 0:
        fail("%s cannot import scipy_openblas32 (%s): run ./bazelw, which installs requirements.txt" % (python, res.stderr.strip()))
    include, lib = res.stdout.strip().split("\n")
    rctx.symlink(include, "include/scipy_openblas")
    rctx.symlink(lib + "/libscipy_openblas.so", "lib/libscipy_openblas.so")
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD.bazel", _BUILD)

local_openblas = repository_rule(
    implementation = _local_openblas_impl,
    environ = ["INFINITRAIN_PYTHON"],
    local = True,
)

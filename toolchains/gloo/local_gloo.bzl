"""Repository rule: Gloo (the CPU collective library PyTorch uses), from Debian's libgloo-dev.

./bazelw installs the package. Without it the repository still loads and //infinitrain/gloo fails at analysis
with one line naming the package, so builds that do not need multi-process CPU collectives are unaffected.
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "gloo",
    srcs = ["lib/libgloo.so"],
    hdrs = glob(["include/gloo/**/*.h"]),
    includes = ["include"],
)
"""

_MISSING = """
package(default_visibility = ["//visibility:public"])

load(":missing.bzl", "missing")

missing(name = "gloo")
"""

_MISSING_BZL = """
def _impl(ctx):
    fail("Gloo not found ({what}): install Debian's libgloo-dev (./bazelw does), or set GLOO_PREFIX to its prefix")

missing = rule(implementation = _impl)
"""

def _local_gloo_impl(rctx):
    prefix = rctx.os.environ.get("GLOO_PREFIX", "/usr")
    header = rctx.path(prefix + "/include/gloo/context.h")
    lib = None
    for d in ["lib", "lib/x86_64-linux-gnu", "lib64"]:
        if rctx.path(prefix + "/" + d + "/libgloo.so").exists:
            lib = prefix + "/" + d + "/libgloo.so"
            break
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    if not header.exists or lib == None:
        what = "no %s" % header if not header.exists else "no libgloo.so under %s" % prefix
        rctx.file("missing.bzl", _MISSING_BZL.replace("{what}", what))
        rctx.file("BUILD.bazel", _MISSING)
        return
    rctx.symlink(prefix + "/include/gloo", "include/gloo")
    rctx.symlink(lib, "lib/libgloo.so")
    rctx.file("BUILD.bazel", _BUILD)

local_gloo = repository_rule(
    implementation = _local_gloo_impl,
    environ = ["GLOO_PREFIX"],
    local = True,
)

"""Repository rule: finds the MACA SDK from $MACA_PATH, without failing when absent.

The result is a .bzl constant; //toolchains/maca turns an absent SDK into one
analysis-time error, and only when --config=maca selects it.
"""

def _local_maca_impl(rctx):
    root = rctx.os.environ.get("MACA_PATH", "")
    if not root:
        why = "MACA_PATH is not set: set it to the MACA SDK root (the folder holding mxgpu_llvm/bin/mxcc)"
    elif not rctx.path(root + "/mxgpu_llvm/bin/mxcc").exists:
        why = "MACA_PATH=%s has no mxgpu_llvm/bin/mxcc: point MACA_PATH at the MACA SDK root" % root
    else:
        why = ""
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD.bazel", "")
    rctx.file("sdk.bzl", "MACA_PATH = %r\nMACA_MISSING = %r\n" % (root, why))

local_maca = repository_rule(
    implementation = _local_maca_impl,
    environ = ["MACA_PATH"],
    local = True,
)

"""maca_library: MACA-dialect sources compiled by mxcc with -x maca.

The same CUDA-dialect kernels the cuda provider compiles with nvcc
(backends/gpu) go through mxcc here; mxcc is also the C++ toolchain of the
whole --config=maca build (@local_maca//:toolchain), so this rule runs the
toolchain's compiler.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_maca//:sdk.bzl", "MACA_MISSING")
load("//toolchains/gpu:gpu_library.bzl", "GPU_LIBRARY_ATTRS", "gpu_library")

def _maca_library_impl(ctx):
    if MACA_MISSING:
        fail("--config=maca: " + MACA_MISSING)
    flags = ["-x", "maca", "-std=c++17", "-O3", "-fPIC"]
    return gpu_library(ctx, find_cpp_toolchain(ctx).compiler_executable, flags, "MxccCompile")

maca_library = rule(
    implementation = _maca_library_impl,
    doc = "Compiles MACA-dialect (.cu or .maca) sources with mxcc -x maca into PIC objects, as CcInfo.",
    attrs = GPU_LIBRARY_ATTRS,
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

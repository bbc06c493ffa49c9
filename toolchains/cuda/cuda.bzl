"""nvcc as a Bazel rule: cuda_library and the //toolchains/cuda:archs flag.

cuda_library compiles each .cu source with nvcc (one action per source) into
a PIC object and returns CcInfo, so cc_library, cc_binary (linkshared too)
and provider_extension can depend on it like on a cc_library. The host
compiler is the C++ toolchain's. The GPU architectures come from the string
flag //toolchains/cuda:archs (default sm_90; a comma list such as
"sm_80,sm_90", each compiled to SASS for that architecture; sm_80 at least).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:sdk.bzl", "CUDA_MISSING", "CUDA_PATH")
load("//toolchains/gpu:gpu_library.bzl", "GPU_LIBRARY_ATTRS", "gpu_library")

CudaArchsInfo = provider(doc = "GPU architectures to compile for.", fields = ["archs"])

def _archs_flag_impl(ctx):
    archs = [a.strip() for a in ctx.build_setting_value.split(",") if a.strip()]
    if not archs:
        fail("--//toolchains/cuda:archs is empty: give a comma list such as sm_80,sm_90")
    for a in archs:
        num = a[3:].rstrip("af")
        if not a.startswith("sm_") or not num.isdigit():
            fail("--//toolchains/cuda:archs: '%s' is not an architecture such as sm_90 or sm_90a" % a)
        if int(num) < 80:
            # The flash-attention kernels' bf16 tensor-core products (mma.sync m16n8k16) need sm_80.
            fail("--//toolchains/cuda:archs: '%s' is older than sm_80, the oldest the cuda provider builds for" % a)
    return [CudaArchsInfo(archs = archs)]

cuda_archs_flag = rule(
    implementation = _archs_flag_impl,
    build_setting = config.string(flag = True),
)

def _fail_missing():
    fail("--config=cuda: " + CUDA_MISSING)

def _unavailable_impl(ctx):
    _fail_missing()

# Stands in for every @local_cuda target when no toolkit was found: analysis fails with one line.
cuda_unavailable = rule(implementation = _unavailable_impl)

def _part_unavailable_impl(ctx):
    fail("--config=cuda: " + ctx.attr.message)

# Stands in for one part of the SDK that is missing (cudnn-frontend's headers), with its own line.
cuda_part_unavailable = rule(implementation = _part_unavailable_impl, attrs = {"message": attr.string()})

def _gencode(arch):
    num = arch[3:]
    return "-gencode=arch=compute_%s,code=sm_%s" % (num, num)

def _cuda_library_impl(ctx):
    if CUDA_MISSING:
        _fail_missing()
    flags = [
        "-x",
        "cu",
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        "-Xcompiler",
        "-fPIC",
        "-ccbin",
        find_cpp_toolchain(ctx).compiler_executable,
    ]
    flags += [_gencode(a) for a in ctx.attr._archs[CudaArchsInfo].archs]
    return gpu_library(ctx, CUDA_PATH + "/bin/nvcc", flags, "NvccCompile")

cuda_library = rule(
    implementation = _cuda_library_impl,
    doc = "Compiles .cu sources with nvcc into PIC objects and exposes them as CcInfo.",
    attrs = dict(GPU_LIBRARY_ATTRS, _archs = attr.label(default = Label("//toolchains/cuda:archs"))),
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

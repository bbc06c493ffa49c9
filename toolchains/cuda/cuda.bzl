"""nvcc as a Bazel rule: cuda_library and the //toolchains/cuda:archs flag.

cuda_library compiles each .cu source with nvcc (one action per source) into
a PIC object and returns CcInfo, so cc_library, cc_binary (linkshared too)
and provider_extension can depend on it like on a cc_library. The host
compiler is the C++ toolchain's. The GPU architectures come from the string
flag //toolchains/cuda:archs (default sm_90; a comma list such as
"sm_80,sm_90", each compiled to SASS for that architecture).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:sdk.bzl", "CUDA_MISSING", "CUDA_PATH")

CudaArchsInfo = provider(doc = "GPU architectures to compile for.", fields = ["archs"])

def _archs_flag_impl(ctx):
    archs = [a.strip() for a in ctx.build_setting_value.split(",") if a.strip()]
    if not archs:
        fail("--//toolchains/cuda:archs is empty: give a comma list such as sm_80,sm_90")
    for a in archs:
        num = a[3:].rstrip("af")
        if not a.startswith("sm_") or not num.isdigit():
            fail("--//toolchains/cuda:archs: '%s' is not an architecture such as sm_90 or sm_90a" % a)
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
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    deps = [d[CcInfo] for d in ctx.attr.deps]
    own = CcInfo(compilation_context = cc_common.create_compilation_context(
        headers = depset(ctx.files.hdrs),
        defines = depset(ctx.attr.defines),
    ))
    cc = cc_common.merge_cc_infos(cc_infos = [own] + deps).compilation_context

    args = [
        "-x",
        "cu",
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        "-Xcompiler",
        "-fPIC",
        "-ccbin",
        cc_toolchain.compiler_executable,
    ]
    args += [_gencode(a) for a in ctx.attr._archs[CudaArchsInfo].archs]

    # The workspace root and its generated twin, then what the deps export.
    args += ["-I.", "-I" + ctx.bin_dir.path]
    for d in cc.includes.to_list() + cc.quote_includes.to_list():
        args.append("-I" + d)
    for d in cc.system_includes.to_list():
        args += ["-isystem", d]
    args += ["-D" + d for d in cc.defines.to_list() + ctx.attr.local_defines]
    args += ctx.attr.copts
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cc.headers])

    objs = []
    for src in ctx.files.srcs:
        if not src.path.endswith(".cu"):
            continue
        stem = src.short_path[:-len(".cu")].replace("../", "external/")
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, stem))
        ctx.actions.run(
            # By absolute path: nvcc finds cicc, ptxas and its headers next to its real location, which a
            # sandbox's per-file symlinks would hide.
            executable = CUDA_PATH + "/bin/nvcc",
            arguments = args + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [inputs]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            use_default_shell_env = True,  # PATH for the host compiler's assembler
            progress_message = "Compiling CUDA %s" % src.short_path,
        )
        objs.append(obj)

    compilation_outputs = cc_common.create_compilation_outputs(
        objects = depset(objs),
        pic_objects = depset(objs),
    )
    linking_context, _ = cc_common.create_linking_context_from_compilation_outputs(
        actions = ctx.actions,
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        compilation_outputs = compilation_outputs,
        linking_contexts = [d.linking_context for d in deps],
        name = ctx.label.name,
        alwayslink = ctx.attr.alwayslink,
        disallow_dynamic_library = True,
    )
    return [
        DefaultInfo(files = depset(objs)),
        CcInfo(compilation_context = cc, linking_context = linking_context),
    ]

cuda_library = rule(
    implementation = _cuda_library_impl,
    doc = "Compiles .cu sources with nvcc into PIC objects and exposes them as CcInfo.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh", ".hpp"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(doc = "Extra nvcc flags."),
        "defines": attr.string_list(doc = "Defines for these sources and for dependents."),
        "local_defines": attr.string_list(doc = "Defines for these sources only."),
        "alwayslink": attr.bool(default = True, doc = "Link every object (kernels register from file scope)."),
        "_archs": attr.label(default = Label("//toolchains/cuda:archs")),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

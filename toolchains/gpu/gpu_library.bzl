"""What cuda_library and maca_library share: compile each CUDA-dialect source
with the vendor's compiler (one action per source) into a PIC object, and
return CcInfo so cc_library, cc_binary (linkshared too) and
provider_extension can depend on it like on a cc_library."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

GPU_LIBRARY_ATTRS = {
    "srcs": attr.label_list(allow_files = [".cu", ".maca", ".cc"]),
    "hdrs": attr.label_list(allow_files = [".h", ".cuh", ".hpp"]),
    "deps": attr.label_list(providers = [CcInfo]),
    "copts": attr.string_list(doc = "Extra compiler flags."),
    "defines": attr.string_list(doc = "Defines for these sources and for dependents."),
    "local_defines": attr.string_list(doc = "Defines for these sources only."),
    "alwayslink": attr.bool(default = True, doc = "Link every object (kernels register from file scope)."),
    "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
}

def gpu_library(ctx, executable, flags, mnemonic):
    """Compiles ctx.files.srcs with `executable` and `flags` (plus includes, defines, copts, -c, -o).

    Returns the rule's providers.
    """
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

    # The workspace root and its generated twin, then what the deps export.
    args = list(flags) + ["-I.", "-I" + ctx.bin_dir.path]
    for d in cc.includes.to_list() + cc.quote_includes.to_list():
        args.append("-I" + d)
    for d in cc.system_includes.to_list():
        args += ["-isystem", d]
    args += ["-D" + d for d in cc.defines.to_list() + ctx.attr.local_defines]
    args += ctx.attr.copts
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cc.headers])

    objs = []
    for src in ctx.files.srcs:
        stem = src.short_path[:src.short_path.rfind(".")].replace("../", "external/")
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, stem))
        ctx.actions.run(
            # By absolute path: the compilers find their tools and headers next to their real location, which
            # a sandbox's per-file symlinks would hide.
            executable = executable,
            arguments = args + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [inputs]),
            outputs = [obj],
            mnemonic = mnemonic,
            use_default_shell_env = True,  # PATH for the host compiler's assembler
            progress_message = "Compiling %s %s" % (mnemonic, src.short_path),
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

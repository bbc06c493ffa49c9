"""The C++ toolchain of --config=maca: mxcc compiles and links everything.

mxcc is clang-based and also the host C++ compiler of MetaX builds. The
toolchain passes no -pthread and no -B (mxcc rejects both); C++ links add
-lstdc++ and -lm themselves, since the driver is invoked as a C compiler.
"""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load("@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl", "feature", "flag_group", "flag_set", "tool_path")

_COMPILE = [ACTION_NAMES.c_compile, ACTION_NAMES.cpp_compile, ACTION_NAMES.cpp_header_parsing]
_LINK = [ACTION_NAMES.cpp_link_executable, ACTION_NAMES.cpp_link_dynamic_library, ACTION_NAMES.cpp_link_nodeps_dynamic_library]

def _flags(actions, flags):
    return flag_set(actions = actions, flag_groups = [flag_group(flags = flags)])

def _impl(ctx):
    tools = {
        "gcc": ctx.attr.mxcc,
        "cpp": ctx.attr.mxcc,
        "ld": "/usr/bin/ld",
        "ar": "/usr/bin/ar",
        "nm": "/usr/bin/nm",
        "objcopy": "/usr/bin/objcopy",
        "objdump": "/usr/bin/objdump",
        "strip": "/usr/bin/strip",
        "gcov": "/usr/bin/false",
        "dwp": "/usr/bin/false",
    }
    features = [
        feature(
            name = "default_link_flags",
            enabled = True,
            flag_sets = [_flags(_LINK, ["-lstdc++", "-lm"])],
        ),
        feature(name = "supports_pic", enabled = True),
        feature(name = "supports_dynamic_linker", enabled = True),
        feature(
            name = "default_compile_flags",
            enabled = True,
            flag_sets = [_flags(_COMPILE, ["-fno-omit-frame-pointer", "-Wall"])],
        ),
        feature(
            name = "opt",
            flag_sets = [_flags(_COMPILE, ["-O2", "-DNDEBUG", "-ffunction-sections", "-fdata-sections"])],
        ),
        feature(name = "dbg", flag_sets = [_flags(_COMPILE, ["-g"])]),
    ]
    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        features = features,
        cxx_builtin_include_directories = ctx.attr.builtin_include_directories,
        toolchain_identifier = "mxcc",
        host_system_name = "local",
        target_system_name = "local",
        target_cpu = "k8",
        target_libc = "local",
        compiler = "mxcc",
        abi_version = "local",
        abi_libc_version = "local",
        tool_paths = [tool_path(name = k, path = v) for k, v in tools.items()],
    )

maca_cc_toolchain_config = rule(
    implementation = _impl,
    attrs = {
        "mxcc": attr.string(mandatory = True, doc = "Absolute path of $MACA_PATH/mxgpu_llvm/bin/mxcc."),
        "builtin_include_directories": attr.string_list(doc = "mxcc's system include folders."),
    },
    provides = [CcToolchainConfigInfo],
)

def _missing_impl(ctx):
    fail("--config=maca: " + ctx.attr.message)

# Stands in for the toolchain when the SDK is missing: analysis fails with one line.
maca_sdk_missing = rule(
    implementation = _missing_impl,
    attrs = {"message": attr.string(mandatory = True)},
    provides = [CcToolchainConfigInfo],
)

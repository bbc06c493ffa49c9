"""Macros for providers: a provider's Python module (`provider_extension`) and a stand-in that fails with one line."""

def _unavailable_impl(ctx):
    fail(ctx.attr.message)

# A target whose analysis fails with one line: selected for a provider that cannot build here.
provider_unavailable = rule(
    implementation = _unavailable_impl,
    attrs = {"message": attr.string(mandatory = True)},
)

def provider_extension(name, srcs, deps = [], copts = [], visibility = None):
    """A provider's pybind11 module `name` (exposing register_backend()) as a py_library of the same name.

    The module links the core's shared library instead of the core itself, so
    the registries it fills are the ones infinitrain._C reads.
    """
    native.cc_binary(
        name = name + ".so",
        srcs = srcs + ["//python:infinitrain/libinfinitrain.so"],
        copts = ["-fvisibility=hidden"] + copts,
        linkshared = True,
        linkstatic = True,
        deps = deps + [
            "//infinitrain:headers",
            "@local_python//:pybind11",
        ],
    )
    native.py_library(
        name = name,
        data = [":" + name + ".so"],
        imports = ["."],
        visibility = visibility,
    )

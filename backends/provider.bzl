"""A provider's Python module (`provider_extension`)."""

def provider_extension(name, srcs, deps = [], copts = [], visibility = None, tags = []):
    """A provider's pybind11 module `name` (exposing register_backend()) as a py_library of the same name.

    The module links the core's shared library instead of the core itself, so
    the registries it fills are the ones infinitrain._C reads.
    """
    native.cc_binary(
        name = name + ".so",
        srcs = srcs,
        copts = ["-fvisibility=hidden"] + copts,
        linkshared = True,
        linkstatic = True,
        tags = tags,
        deps = deps + [
            "//infinitrain:headers",
            "@local_python//:pybind11",
            "//python:core_shared",  # last: after the libraries that use it
        ],
    )
    native.py_library(
        name = name,
        data = [":" + name + ".so"],
        imports = ["."],
        tags = tags,
        visibility = visibility,
    )

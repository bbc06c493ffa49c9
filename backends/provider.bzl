"""The --config=<provider> switch: a string flag naming the provider to build in."""

PROVIDERS = ["sim", "cuda", "maca"]

def _provider_flag_impl(ctx):
    value = ctx.build_setting_value
    if value and value not in PROVIDERS:
        fail("unknown provider '%s': expected one of %s" % (value, ", ".join(PROVIDERS)))
    return []

provider_flag = rule(
    implementation = _provider_flag_impl,
    build_setting = config.string(flag = True),
)

def _unavailable_impl(ctx):
    fail(ctx.attr.message)

# A target whose analysis fails with one line: selected for a provider that cannot build here.
provider_unavailable = rule(
    implementation = _unavailable_impl,
    attrs = {"message": attr.string(mandatory = True)},
)

def provider_deps():
    """The provider libraries //python:infinitrain links, chosen by --config=<provider>."""
    return select({
        "//backends:sim": ["//backends:sim_unavailable"],
        "//backends:cuda": ["//backends:cuda_unavailable"],
        "//backends:maca": ["//toolchains/maca:sdk_check"],
        "//conditions:default": [],
    })

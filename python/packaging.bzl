"""The package outside Bazel: the provider modules a config selects, and the wheel."""

ProviderModulesInfo = provider(fields = ["files"])

def _provider_modules_impl(ctx):
    files = [
        f
        for dep in ctx.attr.deps
        for f in dep[DefaultInfo].default_runfiles.files.to_list()
        if f.basename.startswith("infinitrain_") and f.basename.endswith(".so")
    ]
    # A manifest (one runfiles path a line; empty without a provider), since $(locations) of nothing fails.
    manifest = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(manifest, "".join([f.short_path + "\n" for f in files]))
    return [
        DefaultInfo(files = depset([manifest]), runfiles = ctx.runfiles(files = files + [manifest])),
        ProviderModulesInfo(files = files),
    ]

# The provider extension modules (infinitrain_<name>.so) in the runfiles of `deps`: none without --config.
provider_modules = rule(
    implementation = _provider_modules_impl,
    attrs = {"deps": attr.label_list()},
)

def _py_wheel_impl(ctx):
    out = ctx.actions.declare_file("%s-%s-%s-%s-linux_x86_64.whl" % (ctx.attr.distribution, ctx.attr.version, ctx.attr.python_tag, ctx.attr.python_tag))
    pkg_files = ctx.attr.package[DefaultInfo].default_runfiles.files.to_list()
    args = ctx.actions.args()
    args.add("--out", out)
    args.add("--version", ctx.attr.version)
    args.add("--python_tag", ctx.attr.python_tag)
    args.add_all(ctx.attr.requires, before_each = "--requires")
    inputs = []
    for f in pkg_files:
        # Package files live under python/ in the workspace (python/infinitrain/...).
        if f.short_path.startswith("python/infinitrain/") and (f.extension in ("py", "so")):
            args.add("--file", "%s=%s" % (f.short_path[len("python/"):], f.path))
            inputs.append(f)
    for f in ctx.attr.providers[ProviderModulesInfo].files:
        args.add("--file", "%s=%s" % (f.basename, f.path))
        inputs.append(f)
    ctx.actions.run(
        outputs = [out],
        inputs = inputs,
        executable = ctx.executable._builder,
        arguments = [args],
        mnemonic = "PyWheel",
        progress_message = "Building %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]))]

# A binary wheel of the package (the native core and the selected provider's module included).
py_wheel = rule(
    implementation = _py_wheel_impl,
    attrs = {
        "distribution": attr.string(mandatory = True),
        "version": attr.string(mandatory = True),
        "python_tag": attr.string(mandatory = True),
        "requires": attr.string_list(),
        "package": attr.label(mandatory = True),
        "providers": attr.label(providers = [ProviderModulesInfo]),
        "_builder": attr.label(default = "//python:wheel_builder", executable = True, cfg = "exec"),
    },
)

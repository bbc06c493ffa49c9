"""Launcher for `infinitrain.tools.conformance`.

Running the module\'s own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.tools.conformance", run_name="__main__", alter_sys=True)

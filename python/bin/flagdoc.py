"""Launcher for `infinitrain.tools.flagdoc`.

Running the module\'s own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.tools.flagdoc", run_name="__main__", alter_sys=True)

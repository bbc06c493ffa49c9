"""Launcher for `infinitrain.tools.run_matrix`.

Running the module's own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.tools.run_matrix", run_name="__main__", alter_sys=True)

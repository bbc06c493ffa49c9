"""Launcher for `infinitrain.run`.

Running the module's own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.run", run_name="__main__", alter_sys=True)

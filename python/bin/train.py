"""Launcher for `infinitrain.train`.

Running the module\'s own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.train", run_name="__main__", alter_sys=True)

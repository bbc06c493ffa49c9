"""Launcher for `infinitrain.tools.merge_shards`.

Running the module's own file would put its package folder first on sys.path."""

import runpy

runpy.run_module("infinitrain.tools.merge_shards", run_name="__main__", alter_sys=True)

#!/usr/bin/env bash
# Copies the freshly built extension next to the package sources, so that
# `PYTHONPATH=python pytest tests/` runs without Bazel.
set -euo pipefail
dst="$BUILD_WORKSPACE_DIRECTORY/python/infinitrain/_C.so"
install -m 755 "$1" "$dst"
echo "installed $dst"

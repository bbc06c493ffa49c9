#!/usr/bin/env bash
# Links the built libraries next to the package sources, so that
# `PYTHONPATH=python pytest tests/` runs without Bazel and sees every rebuild.
set -euo pipefail
for f in "$@"; do
    dst="$BUILD_WORKSPACE_DIRECTORY/python/infinitrain/$(basename "$f")"
    ln -sf "$(realpath "$f")" "$dst"
    echo "linked $dst"
done

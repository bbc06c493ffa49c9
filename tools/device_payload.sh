#!/usr/bin/env bash
# Builds the package and the shared suites for one provider and assembles a
# folder that runs them on a machine without Bazel (the same Python version,
# the provider's libraries on the loader path):
#
#   tools/device_payload.sh cuda [OUT]          # OUT defaults to .payload/cuda
#   python3 OUT/run_tests.py [--jobs=N] [args]  # there: every shared suite on device "cuda"
#
# OUT holds python/ (the package with its native modules, the provider's module
# and the test-only providers), lib/ (Gloo's libraries), tests/, examples/, README.md, docs/,
# python/bin/ (train, bench, conformance) and run_tests.py (tools/device_run_tests.py).
# The machine needs Python 3.11 with the wheels the package imports: numpy,
# pytest, absl-py, safetensors, scipy-openblas32 (the core links its OpenBLAS),
# and matplotlib for the compare tool's plots. Extra bazel flags go in BAZEL_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
provider=${1:?usage: tools/device_payload.sh <provider> [out]}
out=${2:-.payload/$provider}

# shellcheck disable=SC2086
./bazelw build --config="$provider" ${BAZEL_FLAGS:-} //python:infinitrain //tests/... >&2
bin=$(./bazelw info --config="$provider" ${BAZEL_FLAGS:-} bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/python" "$out/tests" "$out/docs"
tar -C python --exclude=__pycache__ --exclude='*.so' -cf - infinitrain bin | tar -C "$out/python" -xf -
cp -L "$bin/python/infinitrain/_C.so" "$bin/python/infinitrain/libinfinitrain.so" "$out/python/infinitrain/"
# The cpu's CCL (Gloo) and the libraries it needs beyond the C runtime, which the GPU machine may lack
# (run_tests.py puts lib/ on the loader path).
cp -L "$bin/python/infinitrain/_gloo.so" "$out/python/infinitrain/"
mkdir -p "$out/lib"
gloo=$(ldd "$bin/python/infinitrain/_gloo.so" | awk '$1 ~ /^libgloo/ {print $3}')
[ -f "$gloo" ] || { echo "_gloo.so does not link libgloo" >&2; exit 1; }
{ echo "$gloo"; ldd "$gloo" | awk '$3 ~ /^\// {print $3}'; } \
    | grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|ld-linux[^/]*|libpthread|libdl|librt)\.so' \
    | while read -r lib; do cp -L "$lib" "$out/lib/"; done
for so in "$bin/backends/$provider/infinitrain_$provider.so" "$bin"/tests/fake_provider/infinitrain_*.so; do
    [ -f "$so" ] && cp -L "$so" "$out/python/"
done
[ -f "$out/python/infinitrain_$provider.so" ] || { echo "no module infinitrain_$provider.so was built" >&2; exit 1; }
(cd tests && find . -name "*.py" -o -name pytest.ini) | while read -r f; do
    mkdir -p "$out/tests/$(dirname "$f")" && cp "tests/$f" "$out/tests/$f"
done
cp docs/*.md "$out/docs/"  # tests compare generated reports (ops, flags, the PyTorch API) with them
cp README.md "$out/"  # the README example's test reads it
cp -r examples "$out/"
cp tools/device_run_tests.py "$out/run_tests.py"
echo "$provider" >"$out/provider.txt"
du -sh "$out" >&2

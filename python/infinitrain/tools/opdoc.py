"""Renders docs/ops.md from the op table in code (the single source).

./bazelw run //python:opdoc > docs/ops.md
"""

from infinitrain import _C

PREAMBLE = """# The op contract

Generated from the op table in `infinitrain/op_table.cc` by `./bazelw run //python:opdoc > docs/ops.md`;
`tests/test_op_table.py` fails when this file and the table disagree.

- **Tier**: *required* ops every provider must run natively; *fused* ops have a
  composite definition in terms of required ops that a provider without its
  own kernel falls back to.
- **Attributes** are positional, in the order listed. `ints` is a list of ints.
- **dtypes**: the floating dtypes the op accepts (`all`: any dtype). Float
  kernels compute bfloat16 and float16 in float32, and float32 reductions in
  float64, on the CPU.
- Tensors are contiguous and row-major; binary ops broadcast as NumPy does;
  mixed float dtypes are promoted in Python (bfloat16, float16 < float32 < float64)
  before the dispatcher sees them, which itself requires equal dtypes.
- Ops ending in `_` write their first input (and any listed in place) and return nothing.
- Random ops are counter-based: element i uses (seed, offset + i), so every
  device produces the same numbers.
"""


def render():
    lines = [PREAMBLE, "| op | tier | inputs | attributes | outputs | dtypes | backward uses | computes |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for o in _C.ops():
        cells = [f"`{o['name']}`", o["tier"], o["inputs"], o["attrs"] or "-", o["outputs"] or "-", o["dtypes"]]
        cells += [o["backward"] or "-", o["doc"].replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    n_req = sum(o["tier"] == "required" for o in _C.ops())
    lines.append("")
    lines.append(f"{len(_C.ops())} ops: {n_req} required, {len(_C.ops()) - n_req} fused.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

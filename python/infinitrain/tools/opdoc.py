"""Renders docs/ops.md from the op table in code (the single source).

./bazelw run //python:opdoc > docs/ops.md
"""

from infinitrain import _C

PREAMBLE = """# The op contract

Generated from the op table in `infinitrain/op_table.cc` by `./bazelw run //python:opdoc > docs/ops.md`;
`tests/ops/test_op_table.py` fails when this file and the table disagree.

- **Schema**: `name(inputs; attributes) -> outputs`. An input ending in `?` is
  optional, `...` variadic, `!` written in place (`xs!...`: every tensor from
  there on); `name: int64` fixes an input's dtype. Attributes are positional, in
  the order listed, typed `int`, `float`, `ints` (a list of ints) or `str`. Ops
  ending in `_` write an input; all but fp8_quantize_delayed_ return nothing.
- **Tier**: *required* ops every provider must run natively; *fused* ops have a
  composite definition in terms of required ops, which the dispatcher runs on
  a device without its own kernel; *provider* ops are declared by a provider.
- **dtypes**: what the first input without a fixed dtype accepts (`all`: any
  dtype). Float kernels compute bfloat16 and float16 in float32, and float32
  reductions in float64, on the CPU.
- Tensors are contiguous and row-major; binary ops broadcast as NumPy does;
  mixed float dtypes are promoted in Python (bfloat16, float16 < float32 < float64)
  before the dispatcher sees them, which itself requires equal dtypes.
- Random ops are counter-based: element i uses (seed, offset + i), so every
  device produces the same numbers.
"""


def render():
    ops = [o for o in _C.ops() if o["tier"] != "provider"]
    lines = [PREAMBLE, "| schema | tier | dtypes | backward uses | computes |", "|---|---|---|---|---|"]
    for o in ops:
        cells = [f"`{o['schema']}`", o["tier"], o["dtypes"], o["backward"] or "-", o["doc"].replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    n_req = sum(o["tier"] == "required" for o in ops)
    lines.append("")
    lines.append(f"{len(ops)} ops: {n_req} required, {len(ops) - n_req} fused.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

"""The conformance report's names of outputs: variadic ones ("outs...") numbered from their slot."""

from infinitrain.tools import conformance


def test_variadic_output_names_are_numbered():
    """A table whose last output is variadic ("outs...") names its outputs outs[0], outs[1], ... from that slot."""
    names = ["out", "rest..."]
    assert [conformance._output_name(names, i) for i in range(4)] == ["out", "rest[0]", "rest[1]", "rest[2]"]
    assert [conformance._output_name(["outs..."], i) for i in range(2)] == ["outs[0]", "outs[1]"]
    assert conformance._output_name(["a", "b"], 3) == "output 3"

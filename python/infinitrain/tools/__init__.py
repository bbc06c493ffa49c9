"""Command-line tools: the op reference generator and benchmarks."""

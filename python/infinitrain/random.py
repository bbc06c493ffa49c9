"""Seedable generators. Random kernels are counter-based: element i of a draw
uses (seed, offset + i), so a generator's whole state is two integers and the
same seed gives the same numbers on every device and thread count."""


class Generator:
    def __init__(self, seed=0):
        self.manual_seed(seed)

    def manual_seed(self, seed):
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.seed = seed
        self.offset = 0
        return self

    def advance(self, n):
        """Reserves n counters; returns (seed, first offset)."""
        start = self.offset
        self.offset += int(n)
        return self.seed, start

    def get_state(self):
        return {"seed": self.seed, "offset": self.offset}

    def set_state(self, state):
        self.seed = int(state["seed"])
        self.offset = int(state["offset"])


default_generator = Generator(0)


def manual_seed(seed):
    """Seeds the default generator (used by randn, rand, dropout and parameter init)."""
    return default_generator.manual_seed(seed)

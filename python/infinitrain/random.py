"""Seedable generators. Random kernels are counter-based: element i of a draw
uses (seed, offset + i), so a generator's whole state is two integers and the
same seed gives the same numbers on every device and thread count."""

# Kernels take the seed and offset as int64 attributes.
MAX_SEED = 2**63


def _check_seed(seed):
    # Checked here: a bad seed would otherwise fail later, at the next random op.
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")


class Generator:
    def __init__(self, seed=0):
        self.manual_seed(seed)

    def manual_seed(self, seed):
        _check_seed(seed)
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
        seed, offset = state["seed"], state["offset"]
        _check_seed(seed)
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < MAX_SEED:
            raise ValueError(f"generator offset must be an int in [0, 2**63), got {offset!r}")
        self.seed, self.offset = seed, offset


default_generator = Generator(0)


def manual_seed(seed):
    """Seeds the default generator (used by randn, rand, dropout and parameter init)."""
    return default_generator.manual_seed(seed)

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
    """torch.Generator(device="cpu"): the numbers do not depend on the device, which is kept for PyTorch's API."""

    def __init__(self, device="cpu"):
        if isinstance(device, int) and not isinstance(device, bool):
            raise TypeError(
                "Generator(device): the first argument is a device, as in PyTorch; seed with .manual_seed(n)"
            )
        self.device = device
        self.manual_seed(0)

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


default_generator = Generator()


def manual_seed(seed):
    """Seeds the default generator (used by randn, rand, dropout and parameter init)."""
    return default_generator.manual_seed(seed)


def seed():
    """Seeds the default generator from the operating system's entropy; returns the seed."""
    import secrets

    s = secrets.randbelow(MAX_SEED)
    default_generator.manual_seed(s)
    return s


def initial_seed():
    """The seed the default generator was last seeded with."""
    return default_generator.seed


def get_rng_state():
    """The default generator's state (a dict: seed and offset; PyTorch's is a byte tensor)."""
    return default_generator.get_state()


def set_rng_state(new_state):
    default_generator.set_state(new_state)

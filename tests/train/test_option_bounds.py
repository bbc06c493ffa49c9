"""The run options' documented ranges, stated here by hand rather than read back from the flag declarations (a test
that reads the declared bound passes whatever the bound is): a value just outside is refused when the RunConfig
is made, naming the flag, and the bound itself is accepted. Written for a survivor of the generated-mutant sample
(docs/mutation_python.md: `grad_clip`'s declared lower bound -1.0), which it does not kill: a second check of the
non-negative floats refuses the value anyway, so that mutant is equivalent; the table still pins every range."""

import pytest

from infinitrain.runs import UsageError
from infinitrain.training import RunConfig

# name -> (the smallest value allowed, a value just below it): a negative clip norm, decay, rate or step count is
# meaningless; sizes and counts of things that must exist start at 1.
LOWER = {
    "batch_size": (1, 0),
    "sequence_length": (1, 0),
    "total_batch_size": (0, -1),
    "num_iteration": (1, 0),
    "learning_rate": (0.0, -1e-6),
    "weight_decay": (0.0, -1e-6),
    "grad_clip": (0.0, -0.5),
    "seed": (0, -1),
    "lr_warmup_iters": (0, -1),
    "lr_warmup_init": (0.0, -1e-6),
    "min_lr": (0.0, -1e-6),
    "lr_decay_iters": (0, -1),
    "val_batches": (1, 0),
}


@pytest.mark.parametrize("name", sorted(LOWER))
def test_a_value_below_the_range_is_refused_naming_the_flag(name):
    lowest, below = LOWER[name]
    with pytest.raises(UsageError) as e:
        RunConfig(**{name: below})
    assert f"--{name}={below}" in str(e.value) and ">=" in str(e.value), str(e.value)
    assert getattr(RunConfig(**{name: lowest}), name) == lowest


def test_the_seed_fits_63_bits():
    assert RunConfig(seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(UsageError, match="--seed="):
        RunConfig(seed=2**63)

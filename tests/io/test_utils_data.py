"""it.utils.data as PyTorch users write it: datasets, samplers, collation and DataLoader in the main process and in
worker processes (order, shuffling with a generator, drop_last, iterable datasets sharded by worker, errors and
dead workers reported, pinned batches), DistributedSampler's shares, and activation checkpointing."""

import os
import signal

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng
from infinitrain.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    get_worker_info,
    random_split,
)


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": np.full(3, float(i)), "y": i * i, "name": f"s{i}"}


class Stream(IterableDataset):
    """0..n-1, each worker taking every num_workers-th item."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class Failing(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return np.float64(i)


class Dying(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.float64(i)


def test_default_collate():
    batch = default_collate([{"x": np.ones(2), "y": 1, "z": 0.5, "s": "a", "t": (True, [1, 2])}] * 3)
    assert batch["x"].shape == (3, 2) and batch["y"].dtype == "int64" and batch["z"].dtype == "float64"
    assert batch["s"] == ["a", "a", "a"] and batch["t"][0].dtype == "bool" and batch["t"][1][0].shape == (3,)
    ts = default_collate([it.tensor([1.0, 2.0]), it.tensor([3.0, 4.0])])
    np.testing.assert_array_equal(ts.numpy(), [[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="default_collate"):
        default_collate([object(), object()])
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [1]])


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_order_batches_and_drop_last(workers):
    ds = Squares(11)
    batches = list(DataLoader(ds, batch_size=4, num_workers=workers))
    assert [b["y"].numpy().tolist() for b in batches] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]
    assert batches[0]["x"].shape == (4, 3) and batches[2]["name"] == ["s8", "s9", "s10"]
    assert len(DataLoader(ds, batch_size=4, drop_last=True, num_workers=workers)) == 2
    assert [len(b["y"]) for b in DataLoader(ds, batch_size=4, drop_last=True, num_workers=workers)] == [4, 4]
    single = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(single) == 11 and single[2]["y"] == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_with_generator_repeats(workers):
    ds = TensorDataset(it.arange(20), it.arange(20) * 10)

    def epoch(seed):
        gen = it.Generator().manual_seed(seed)
        return np.concatenate(
            [b[0].numpy() for b in DataLoader(ds, 6, shuffle=True, generator=gen, num_workers=workers)]
        )

    a, b, c = epoch(1), epoch(1), epoch(2)
    np.testing.assert_array_equal(a, b)
    assert sorted(a.tolist()) == list(range(20)) and not np.array_equal(a, c)
    it.manual_seed(5)
    d = [int(x) for b in DataLoader(ds, 20, shuffle=True) for x in b[0].numpy()]
    it.manual_seed(5)
    e = [int(x) for b in DataLoader(ds, 20, shuffle=True) for x in b[0].numpy()]
    assert d == e  # it.manual_seed fixes the shuffle without a generator


def test_iterable_dataset_across_workers():
    assert sorted(int(x) for b in DataLoader(Stream(23), batch_size=4) for x in b.numpy()) == list(range(23))
    got = sorted(int(x) for b in DataLoader(Stream(23), batch_size=4, num_workers=3) for x in b.numpy())
    assert got == list(range(23))
    assert len(list(DataLoader(Stream(10), batch_size=None, num_workers=2))) == 10


def test_worker_errors_and_deaths_are_reported():
    with pytest.raises(RuntimeError, match="sample 5 is broken"):
        list(DataLoader(Failing(), batch_size=2, num_workers=2))
    with pytest.raises(ValueError, match="sample 5 is broken"):
        list(DataLoader(Failing(), batch_size=2))
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(DataLoader(Dying(), batch_size=2, num_workers=2))


def test_worker_init_and_info():
    class Ids(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            info = get_worker_info()
            return np.array([info.id, info.num_workers, int(os.environ.get("WORKER_TAG", "-1"))])

    def init(worker_id):
        os.environ["WORKER_TAG"] = str(100 + worker_id)

    rows = np.concatenate([b.numpy() for b in DataLoader(Ids(), batch_size=1, num_workers=2, worker_init_fn=init)])
    assert set(rows[:, 0]) == {0, 1} and set(rows[:, 1]) == {2} and set(rows[:, 2]) == {100, 101}
    assert get_worker_info() is None


def test_pin_memory_batches():
    ds = TensorDataset(it.arange(8).float())
    if DEVICE == "cpu" and it.backends.registered() is None:
        with pytest.warns(UserWarning, match="no accelerator"):
            batches = list(DataLoader(ds, batch_size=4, pin_memory=True))
        assert not batches[0][0].is_pinned()
        return
    it.device(DEVICE)  # registers the provider
    for (b,) in DataLoader(ds, batch_size=4, pin_memory=True):
        assert b.is_pinned()
        if DEVICE != "cpu":
            moved = b.to(DEVICE, non_blocking=True)
            np.testing.assert_array_equal(moved.numpy(), b.numpy())


def test_samplers_and_splits():
    n = 10
    assert list(SequentialSampler(range(n))) == list(range(n))
    gen = it.Generator().manual_seed(0)
    perm = list(RandomSampler(range(n), generator=gen))
    assert sorted(perm) == list(range(n))
    draws = list(RandomSampler(range(n), replacement=True, num_samples=25, generator=gen))
    assert len(draws) == 25 and all(0 <= d < n for d in draws)
    assert list(BatchSampler(range(7), 3, False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, True)) == [[0, 1, 2], [3, 4, 5]]
    w = np.zeros(5)
    w[3] = 1.0
    assert set(WeightedRandomSampler(w, 20, generator=gen)) == {3}
    parts = random_split(range(10), [0.3, 0.7], generator=it.Generator().manual_seed(1))
    assert [len(p) for p in parts] == [3, 7] and sorted(list(parts[0]) + list(parts[1])) == list(range(10))
    again = random_split(range(10), [3, 7], generator=it.Generator().manual_seed(1))
    assert list(again[0]) == list(parts[0])
    with pytest.raises(ValueError, match="sum"):
        random_split(range(10), [3, 3])
    cat = ConcatDataset([Squares(3), Squares(2)])
    assert len(cat) == 5 and cat[3]["y"] == 0 and cat[-1]["y"] == 1
    sub = Subset(Squares(10), [7, 2])
    assert len(sub) == 2 and sub[0]["y"] == 49
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(Squares(3), sampler=SequentialSampler(range(3)), shuffle=True)


def test_distributed_sampler_shares():
    n, world = 11, 3
    shares = [list(DistributedSampler(range(n), world, r, shuffle=True, seed=4)) for r in range(world)]
    assert all(len(s) == 4 for s in shares)
    flat = sorted(i for s in shares for i in s)
    assert set(flat) == set(range(n)) and len(flat) == 12  # one index repeated to even out the shares
    s0 = DistributedSampler(range(n), world, 0, seed=4)
    first = list(s0)
    s0.set_epoch(1)
    assert list(s0) != first and sorted(set(list(s0))) != []
    dropped = [list(DistributedSampler(range(n), world, r, shuffle=False, drop_last=True)) for r in range(world)]
    assert dropped == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError, match="rank"):
        DistributedSampler(range(n), 2, 2)


def test_distributed_sampler_shuffles_by_seed_plus_epoch():
    """The shuffle is drawn from seed + epoch (PyTorch's rule): epoch e of seed s is epoch 0 of seed s + e, and a
    seed's epochs differ from one another (seed 1's epochs 0 and 1 included)."""

    def order(seed, epoch):
        s = DistributedSampler(range(40), 1, 0, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    for seed, epoch in ((1, 1), (3, 1), (5, 2), (6, 3)):
        assert order(seed, epoch) == order(seed + epoch, 0)
    firsts = [order(1, e) for e in range(4)]
    assert all(firsts[i] != firsts[j] for i in range(4) for j in range(i))


def test_distributed_sampler_pads_with_the_first_indices_in_linear_memory():
    """Without drop_last the order is padded to num_samples * world with its own first indices (10 items over 4
    ranks: 0 and 1 again), and only that far: iterating a share of a 1000-item dataset allocates a few dozen bytes
    an item (under 400; the whole order repeated n times over would be 16 kB an item)."""
    import tracemalloc

    shares = [list(DistributedSampler(range(10), 4, r, shuffle=False)) for r in range(4)]
    assert shares == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    n = 1000
    for shuffle in (False, True):
        s = DistributedSampler(range(n), 3, 1, shuffle=shuffle, seed=2)
        list(s)  # the first draw's one-time setup is not the sampler's size
        tracemalloc.start()
        try:
            got = list(s)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(got) == 334 and peak < 400 * n, peak


def test_checkpoint_recomputes_with_the_same_gradients():
    from infinitrain.utils.checkpoint import checkpoint, checkpoint_sequential

    lin1 = it.nn.Linear(6, 8, device=DEVICE, dtype="float64")
    lin2 = it.nn.Linear(8, 3, device=DEVICE, dtype="float64")
    x = it.tensor(rng().standard_normal((5, 6)), device=DEVICE)

    def block(a):
        return lin2(it.tanh(lin1(a)))

    def grads(use_ckpt):
        for p in (*lin1.parameters(), *lin2.parameters()):
            p.grad = None
        xi = x.detach().requires_grad_()
        out = checkpoint(block, xi, use_reentrant=False) if use_ckpt else block(xi)
        (out * out).sum().backward()
        return [xi.grad.numpy()] + [p.grad.numpy() for p in (*lin1.parameters(), *lin2.parameters())]

    for a, b in zip(grads(False), grads(True), strict=True):
        np.testing.assert_array_equal(a, b)
    seq = it.nn.Sequential(lin1, it.nn.Tanh(), lin2)
    np.testing.assert_array_equal(checkpoint_sequential(seq, 2, x).numpy(), seq(x).numpy())

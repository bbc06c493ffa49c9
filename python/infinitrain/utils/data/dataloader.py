"""DataLoader: batches of a dataset, read in the main process or in worker processes.

Workers are processes (fork where the platform has it, as PyTorch on Linux), each running the dataset and the
collate function with one CPU thread (the kernels' OpenMP pool does not survive a fork). A map-style dataset's
batches of indices go to the workers in turn and come back in order (or as they finish, with in_order=False);
an iterable dataset is iterated by every worker on its own copy (get_worker_info() tells each its share). A
worker's exception is raised in the main process with the worker's traceback; a worker that dies or a batch that
takes longer than `timeout` seconds is an error naming the worker, never a hang.
"""

import itertools
import multiprocessing
import queue
import sys
import traceback
import warnings
from dataclasses import dataclass

from infinitrain.utils.data.collate import default_collate, default_convert, pin
from infinitrain.utils.data.dataset import IterableDataset
from infinitrain.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler

# Seconds between checks that workers are alive while waiting for a batch.
_POLL = 1.0


@dataclass
class WorkerInfo:
    id: int
    num_workers: int
    seed: int
    dataset: object


_worker_info = None


def get_worker_info():
    """In a DataLoader worker: its WorkerInfo (id, num_workers, seed, dataset); in the main process None."""
    return _worker_info


class _Error:
    """An exception raised in a worker, carried back as text (the exception itself may not pickle)."""

    def __init__(self, worker, exc):
        self.worker = worker
        self.kind = type(exc).__name__
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class _End:
    """An iterable dataset's worker has no more samples."""

    def __init__(self, worker):
        self.worker = worker


def _worker_loop(
    dataset,
    index_queue,
    result_queue,
    collate_fn,
    auto_collation,
    batch_size,
    drop_last,
    worker_id,
    num_workers,
    seed,
    worker_init_fn,
):
    global _worker_info
    try:
        from infinitrain import _C

        _C.set_num_threads(1)
    except Exception:  # noqa: BLE001 (a worker without the native core still loads pure-Python data)
        pass
    from infinitrain import random as _random

    _random.manual_seed(seed % _random.MAX_SEED)
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        stream = iter(dataset) if isinstance(dataset, IterableDataset) else None
    except Exception as e:  # noqa: BLE001 (reported to the main process)
        result_queue.put((None, _Error(worker_id, e)))
        return
    while True:
        task = index_queue.get()
        if task is None:
            return
        key, indices = task
        try:
            if stream is not None:
                if auto_collation:
                    samples = list(itertools.islice(stream, batch_size))
                    if not samples or (drop_last and len(samples) < batch_size):
                        result_queue.put((key, _End(worker_id)))
                        continue
                    data = collate_fn(samples)
                else:
                    try:
                        data = collate_fn(next(stream))
                    except StopIteration:
                        result_queue.put((key, _End(worker_id)))
                        continue
            elif auto_collation:
                data = collate_fn([dataset[i] for i in indices])
            else:
                data = collate_fn(dataset[indices])
        except Exception as e:  # noqa: BLE001
            data = _Error(worker_id, e)
        result_queue.put((key, data))


class DataLoader:
    """Batches of `dataset`, as torch.utils.data.DataLoader: batch_size (None: samples as they are), shuffle
    (with `generator`), sampler / batch_sampler, drop_last, collate_fn, num_workers (processes), worker_init_fn,
    prefetch_factor, timeout, pin_memory (batches in page-locked memory for non_blocking copies), in_order."""

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
    ):
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be non-negative; got num_workers={num_workers!r}")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if prefetch_factor is not None and num_workers == 0:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing (num_workers > 0)")
        iterable = isinstance(dataset, IterableDataset)
        if iterable and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError("DataLoader with an IterableDataset: shuffle, sampler and batch_sampler must be unset")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
            )
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_workers, self.timeout, self.worker_init_fn = num_workers, timeout, worker_init_fn
        self.pin_memory, self.generator, self.in_order = pin_memory, generator, in_order
        self.prefetch_factor = 2 if prefetch_factor is None and num_workers > 0 else prefetch_factor
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        if batch_sampler is not None:
            self.batch_size, self.drop_last = None, False
        if iterable:
            self.sampler, self.batch_sampler = None, None
        else:
            if sampler is None:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
            self.sampler = sampler
            if batch_sampler is None and batch_size is not None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
            self.batch_sampler = batch_sampler
        self._auto_collation = batch_sampler is not None or (iterable and batch_size is not None)
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    def __len__(self):
        if isinstance(self.dataset, IterableDataset):
            n = len(self.dataset)  # TypeError for a dataset without __len__, as PyTorch
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)

    def _index_stream(self):
        if isinstance(self.dataset, IterableDataset):
            return itertools.repeat(None)
        return iter(self.batch_sampler) if self.batch_sampler is not None else iter(self.sampler)

    def _pin(self):
        """Whether batches are pinned: pin_memory, and an accelerator provider to pin for (without one PyTorch warns
        and does not pin, and so does this)."""
        if not self.pin_memory:
            return False
        from infinitrain import _C

        if _C.privateuse1() is None:
            warnings.warn(
                "DataLoader: pin_memory=True but no accelerator provider is registered; not pinning", stacklevel=3
            )
            self.pin_memory = False
        return self.pin_memory

    def __iter__(self):
        pinned = self._pin()
        if self.num_workers == 0:
            batches = self._single_process()
        else:
            batches = _WorkerPool(self).batches()
        for b in batches:
            yield pin(b) if pinned else b

    def _single_process(self):
        if isinstance(self.dataset, IterableDataset):
            stream = iter(self.dataset)
            if not self._auto_collation:
                for sample in stream:
                    yield self.collate_fn(sample)
                return
            while True:
                samples = list(itertools.islice(stream, self.batch_size))
                if not samples or (self.drop_last and len(samples) < self.batch_size):
                    return
                yield self.collate_fn(samples)
        for indices in self._index_stream():
            if self._auto_collation:
                yield self.collate_fn([self.dataset[i] for i in indices])
            else:
                yield self.collate_fn(self.dataset[indices])


class _WorkerPool:
    """One epoch's worker processes: tasks out, batches back, in order, with liveness and timeout checks."""

    def __init__(self, loader):
        self.loader = loader
        ctx = loader.multiprocessing_context
        if ctx is None:
            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
        elif isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self.ctx = ctx
        from infinitrain.random import MAX_SEED, default_generator
        from infinitrain.tensor import host_rng

        self.base_seed = int(host_rng(loader.generator or default_generator, 1).integers(0, MAX_SEED))

    def batches(self):
        ld = self.loader
        n = ld.num_workers
        results = self.ctx.Queue()
        index_queues = [self.ctx.Queue() for _ in range(n)]
        workers = []
        for w in range(n):
            p = self.ctx.Process(
                target=_worker_loop,
                args=(
                    ld.dataset,
                    index_queues[w],
                    results,
                    ld.collate_fn,
                    ld._auto_collation,
                    ld.batch_size,
                    ld.drop_last,
                    w,
                    n,
                    self.base_seed + w,
                    ld.worker_init_fn,
                ),
                daemon=True,
            )
            p.start()
            workers.append(p)
        try:
            yield from self._run(workers, index_queues, results)
        finally:
            for q in index_queues:
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
            for p in workers:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
            for q in [*index_queues, results]:
                q.cancel_join_thread()
                q.close()

    def _run(self, workers, index_queues, results):
        ld = self.loader
        n = len(workers)
        tasks = ld._index_stream()
        iterable = isinstance(ld.dataset, IterableDataset)
        active = set(range(n))  # workers that may still produce (iterable datasets end per worker)
        sent = 0
        next_worker = itertools.cycle(range(n))
        owner = {}
        buffered = {}
        want = 0
        outstanding = 0

        def send():
            nonlocal sent, outstanding
            if not active:
                return False
            try:
                indices = next(tasks)
            except StopIteration:
                return False
            w = next(next_worker)
            while w not in active:
                w = next(next_worker)
            owner[sent] = w
            index_queues[w].put((sent, indices))
            sent += 1
            outstanding += 1
            return True

        for _ in range(ld.prefetch_factor * n):
            if not send():
                break
        while outstanding:
            key, data = self._get(results, workers, owner, buffered, want)
            outstanding -= 1
            if isinstance(data, _Error):
                raise RuntimeError(
                    f"Caught {data.kind} in DataLoader worker process {data.worker}.\nOriginal {data.text}"
                )
            if isinstance(data, _End):
                active.discard(data.worker)
                data = None
            if not ld.in_order and data is not None:
                send()
                yield data
                continue
            buffered[key] = data
            while want in buffered:
                item = buffered.pop(want)
                want += 1
                send()
                if item is not None:
                    yield item
            if iterable and not active:
                return

    def _get(self, results, workers, owner, buffered, want):
        waited = 0.0
        while True:
            try:
                return results.get(timeout=_POLL)
            except queue.Empty:
                waited += _POLL
            for i, p in enumerate(workers):
                if not p.is_alive() and p.exitcode not in (0, None):
                    raise RuntimeError(
                        f"DataLoader worker {i} (pid {p.pid}) exited unexpectedly with exit code {p.exitcode}"
                    )
            if self.loader.timeout and waited >= self.loader.timeout:
                w = owner.get(want, "?")
                raise RuntimeError(f"DataLoader timed out after {self.loader.timeout} seconds waiting for worker {w}")

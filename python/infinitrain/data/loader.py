"""Resumable, shardable batch loader over a token stream.

The stream is cut into chunks of B*T tokens; a batch is one chunk plus the next token (for the targets).
Each epoch visits the chunks in an order fixed by (seed, epoch) -- a permutation, or file order when
shuffle=False -- and rank r of world_size takes every world_size-th chunk of that order, so ranks never
share a chunk within an epoch and all ranks have the same number of batches. The position is two ints,
which makes resuming exact.
"""

from __future__ import annotations

import os

import numpy as np

from .tokens import TokenFile

_CONFIG_KEYS = ("batch_size", "seq_len", "shuffle", "seed", "rank", "world_size", "n_tokens")


class DataLoader:
    def __init__(
        self,
        path_or_tokens,
        batch_size: int,
        seq_len: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if isinstance(path_or_tokens, (str, os.PathLike)):
            self.source = os.fspath(path_or_tokens)
            tokens = TokenFile(self.source)  # read per batch with pread: no memory map to SIGBUS on
        else:
            self.source = "<array>"
            tokens = np.asarray(path_or_tokens)
            if tokens.ndim != 1:
                raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
            if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
                raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
        self.tokens = tokens
        self.batch_size = int(batch_size)
        self.seq_len = int(seq_len)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.chunk = self.batch_size * self.seq_len
        needed = self.chunk * self.world_size + 1
        if len(tokens) < needed:
            raise ValueError(
                f"{self.source}: has {len(tokens)} tokens, but batch_size={self.batch_size} x seq_len={self.seq_len}"
                + (f" x world_size={self.world_size}" if self.world_size > 1 else "")
                + f" needs at least {needed}"
            )
        self.n_chunks = (len(tokens) - 1) // self.chunk
        self.batches_per_epoch = self.n_chunks // self.world_size
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            if self.shuffle:
                # Seeding with the pair (not seed + epoch) keeps different seeds from sharing epoch orders.
                order = np.random.default_rng([self.seed, epoch]).permutation(self.n_chunks)
            else:
                order = np.arange(self.n_chunks)
            self._order = order[self.rank :: self.world_size][: self.batches_per_epoch]
            self._order_epoch = epoch
        return self._order

    def chunk_starts(self, epoch: int) -> np.ndarray:
        """Token offsets of this rank's batches in `epoch`, in visiting order."""
        return self._epoch_order(epoch) * self.chunk

    def __iter__(self):
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        start = int(self._epoch_order(self.epoch)[self.position]) * self.chunk
        self.position += 1
        window = np.asarray(self.tokens[start : start + self.chunk + 1]).astype(np.int64)
        if len(window) != self.chunk + 1:
            raise ValueError(f"{self.source}: short read at token {start} (the file changed while in use?)")
        shape = (self.batch_size, self.seq_len)
        # Separate buffers so a caller editing x in place cannot change y.
        return window[:-1].reshape(shape), window[1:].reshape(shape).copy()

    next_batch = __next__

    def state_dict(self) -> dict:
        """Position plus the configuration it is valid for; all values are ints."""
        return {
            "epoch": int(self.epoch),
            "position": int(self.position),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "shuffle": int(self.shuffle),
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "n_tokens": int(len(self.tokens)),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for key in _CONFIG_KEYS:
            if key in state and int(state[key]) != mine[key]:
                raise ValueError(f"loader state was saved with {key}={state[key]}, this loader has {key}={mine[key]}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.batches_per_epoch:
            raise ValueError(
                f"loader state out of range: epoch={epoch}, position={position} "
                f"(batches per epoch: {self.batches_per_epoch})"
            )
        self.epoch, self.position = epoch, position

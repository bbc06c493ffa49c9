"""The process grid of a layout: this rank's coordinates and its groups.

Global rank = (dp * pp + stage) * tp + tp_rank: tensor-parallel peers are neighbours (the fastest links on one
host), then pipeline stages, then data-parallel replicas. Groups:

    tp        the ranks of one stage of one replica (tensor parallel)
    dp        the ranks with this (stage, tp_rank) (gradient averaging, ZeRO)
    pp        the stages of one pipeline (the loss is reduced over it)
    mp        every rank of this replica (tp x pp: the gradient norm)
    embedding the first and last stage of this pipeline (the tied GPT-2 embedding's gradient)
    p2p       one two-rank group per (kind, sender, receiver) of neighbouring stages: activations and
              gradients travel on separate channels, so each channel's messages arrive in the order sent

Every group is made on every rank in one global order (new_group's rule), and this rank's communicators are made
eagerly in that order, so no collective is ever the first meeting of a group (a first meeting blocks until
all members arrive, which a pipeline's sender would otherwise do inside its send).
"""

from infinitrain.distributed.group import NON_GROUP_MEMBER, default_group, new_group
from infinitrain.parallel.layout import Layout


class Grid:
    def __init__(self, layout, device="cpu"):
        self.layout, self.device = layout, device
        if layout.world == 1:
            self.rank = 0
        else:
            world = default_group()
            if world.size != layout.world:
                raise ValueError(f"Grid: the layout {layout.describe()} needs {layout.world} ranks, got {world.size}")
            self.rank = world.ranks[world.rank]
        self.dp_rank, self.stage, self.tp_rank = layout.coords(self.rank)
        self.tp = self.dp = self.pp = self.mp = self.embedding = None
        self._send, self._recv = {}, {}  # (kind, peer stage) -> (group, peer global rank)
        if layout.world > 1:
            self._make_groups()

    @property
    def first(self):
        return self.stage == 0

    @property
    def last(self):
        return self.stage == self.layout.pp - 1

    def peer(self, stage):
        """The global rank of `stage` in this rank's pipeline (same replica, same tp rank)."""
        return self.layout.rank_of(self.dp_rank, stage, self.tp_rank)

    def _make_groups(self):
        L = self.layout
        made = []

        def group(ranks):
            g = new_group(ranks)  # every rank, every group, the same order
            if g is not NON_GROUP_MEMBER:
                made.append(g)
                return g
            return None

        for d in range(L.dp):
            for s in range(L.pp):
                g = group([L.rank_of(d, s, t) for t in range(L.tp)])
                self.tp = g or self.tp
        for s in range(L.pp):
            for t in range(L.tp):
                g = group([L.rank_of(d, s, t) for d in range(L.dp)])
                self.dp = g or self.dp
        for d in range(L.dp):
            for t in range(L.tp):
                g = group([L.rank_of(d, s, t) for s in range(L.pp)])
                self.pp = g or self.pp
            g = group([L.rank_of(d, s, t) for s in range(L.pp) for t in range(L.tp)])
            self.mp = g or self.mp
        if L.pp > 1:
            links = [(s, s + 1) for s in range(L.pp - 1)]
            if L.vpp > 1 and L.pp > 2:  # the last stage feeds the first's next chunk
                links.append((L.pp - 1, 0))
            elif L.vpp > 1:
                links = [(0, 1), (1, 0)]
            for d in range(L.dp):
                for t in range(L.tp):
                    g = group([L.rank_of(d, 0, t), L.rank_of(d, L.pp - 1, t)])
                    self.embedding = g or self.embedding
                    for a, b in links:
                        for kind, src, dst in (("act", a, b), ("grad", b, a)):
                            ra, rb = L.rank_of(d, src, t), L.rank_of(d, dst, t)
                            g = group([ra, rb])
                            if g is not None:
                                if self.rank == ra:
                                    self._send[(kind, dst)] = (g, rb)
                                else:
                                    self._recv[(kind, src)] = (g, ra)
        for g in made:
            if g.size > 1:
                g.communicator(self.device)

    def send_channel(self, kind, stage):
        """(group, peer rank) that carries `kind` ("act" or "grad") from this rank to `stage`."""
        return self._send[(kind, stage)]

    def recv_channel(self, kind, stage):
        return self._recv[(kind, stage)]

    def __repr__(self):
        return (
            f"Grid({self.layout.describe()}: rank {self.rank} = dp {self.dp_rank}, stage {self.stage}, "
            f"tp {self.tp_rank})"
        )


def single(layout=None, device="cpu"):
    """The grid of one process (no groups): the engine then trains as a plain model does."""
    return Grid(layout or Layout(), device)

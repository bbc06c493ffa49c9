"""ZeroRedundancyOptimizer: ZeRO stages 1, 2 and 3 over a process group (PyTorch's name and shape for stage 1;
stage 3 steps the shards of FullyShardedDataParallel, fsdp.py).

    ddp = DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), it.optim.AdamW, lr=1e-3, stage=2, ddp=ddp)

Each parameter is owned by one rank (whole tensors, the largest first, each to the rank owning the fewest
elements so far), and only its owner keeps its optimizer state: the state's memory is divided by the group size.
Stage 1: DDP all-reduces every gradient as usual; each rank steps the parameters it owns. Stage 2: DDP reduces
each gradient to its owner only (buckets are formed per owner), and the other ranks drop theirs, so gradient
memory is divided too. After the step every owner broadcasts its parameters (flattened, one collective per
owner and dtype). clip_grad_norm_ takes the norm over the owners' gradients. state_dict() after consolidate_state_dict()
is a plain optimizer's state over all the parameters, so a checkpoint loads into any number of ranks, or none.
"""

import json
import re

from infinitrain import autograd, functional
from infinitrain import optim as _optim
from infinitrain.distributed.collectives import all_reduce, broadcast, recv, send
from infinitrain.distributed.group import NON_GROUP_MEMBER, default_group
from infinitrain.tensor import empty, zeros

_INDEXED = re.compile(r"^(.*)\.(\d+)$")


class ZeroRedundancyOptimizer:
    def __init__(self, params, optimizer_class=None, process_group=None, stage=1, ddp=None, fsdp=None, **defaults):
        group = process_group if process_group is not None else default_group()
        if group is NON_GROUP_MEMBER:
            raise ValueError("ZeroRedundancyOptimizer: this rank is not in the process group")
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeroRedundancyOptimizer: stage must be 1, 2 or 3, got {stage!r}")
        if stage == 2 and ddp is None:
            raise ValueError("ZeroRedundancyOptimizer: stage 2 shards gradients inside DDP: pass ddp=<the model>")
        if stage == 3 and fsdp is None:
            raise ValueError("ZeroRedundancyOptimizer: stage 3 steps FullyShardedDataParallel's shards: pass fsdp=")
        self.optimizer_class = optimizer_class or _optim.AdamW
        self.process_group, self.stage = group, stage
        # The full parameter groups, as a plain optimizer over every parameter would hold them (schedules set
        # their lr; state_dict's layout follows them).
        self._plain = self.optimizer_class(params, **defaults)
        self.param_groups = self._plain.param_groups
        self.defaults = self._plain.defaults
        self._all = self._plain.params
        self._plain = None  # its state (the full size) is not kept
        self._fsdp = fsdp if stage == 3 else None
        if stage == 3:  # the owner of each parameter is the one holding it
            self.owner = [fsdp.owner[id(p)] for p in self._all]
        else:
            self.owner = partition(self._all, group.size)
        me = group.rank
        self._mine = [i for i, o in enumerate(self.owner) if o == me]
        local_groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            owned = [p for i, p in enumerate(g["params"], start) if self.owner[i] == me]
            local_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": owned})
            start += n
        self._local = None
        if self._mine:
            self._local = self.optimizer_class([g for g in local_groups if g["params"]], **defaults)
            self._group_of_local = [k for k, lg in enumerate(local_groups) if lg["params"]]
        self._consolidated = None
        self._steps = 0  # a rank that owns nothing counts the steps itself
        self._ddp = ddp if stage == 2 else None
        if stage == 2:
            ddp._shard_gradients({id(p): o for p, o in zip(self._all, self.owner, strict=True)})

    # ---- a plain optimizer's face ----

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        for g in self.param_groups:
            g["lr"] = value

    @property
    def step_count(self):
        return self._local.step_count if self._local else self._steps

    def zero_grad(self, set_to_none=True):
        if self._fsdp is not None:
            self._fsdp.clear_stash()
        for p in self._all:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    @autograd.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with autograd.enable_grad():
                loss = closure()
        if self._local is not None:
            for lg, k in zip(self._local.param_groups, self._group_of_local, strict=True):
                lg.update({key: v for key, v in self.param_groups[k].items() if key != "params"})
            self._local.step()
        else:
            self._steps += 1
        if self.stage < 3:  # stage 3: the others hold no copy to update
            self._sync_parameters()
        if self._ddp is not None:
            self._ddp._reduced_to_owners = False  # the next backward reduces the next step's gradients
        return loss

    def _sync_parameters(self):
        """Every owner broadcasts the parameters it stepped, flattened: one collective per owner and dtype."""
        g = self.process_group
        dtypes = sorted({p.dtype for p in self._all})
        for r, dtype in ((r, d) for r in range(g.size) for d in dtypes):
            params = [p for p, o in zip(self._all, self.owner, strict=True) if o == r and p.dtype == dtype]
            if not params:
                continue
            if r == g.rank:
                flat = functional.cat([p.reshape(-1) for p in params])
            else:
                flat = empty((sum(p.numel() for p in params),), dtype=params[0].dtype, device=params[0].device)
            broadcast(flat, g.ranks[r], g)
            if r != g.rank:
                for p, part in zip(params, functional.split(flat, [p.numel() for p in params]), strict=True):
                    p.copy_(part.reshape(p.shape))

    @autograd.no_grad()
    def clip_grad_norm_(self, max_norm):
        """clip_grad_norm_ over the whole model's gradients, each counted once (at its owner); returns the norm
        before clipping as a 0-d tensor, the same on every rank."""
        owned = [self._all[i] for i in self._mine]
        grads = [p.grad for p in owned if p.grad is not None]
        device = self._all[0].device
        total = zeros((), dtype="float32", device=device)
        if grads:
            s = _optim.optimizers.squared_norm(grads)
            total = total + (s if s.dtype == "float32" else s.to("float32"))
        all_reduce(total, "sum", self.process_group)
        norm = functional.sqrt(total)
        _optim.optimizers.scale_to_norm(grads, norm, max_norm)
        return norm

    # ---- checkpoints ----

    def consolidate_state_dict(self, to=0):
        """Gathers every owner's state on global rank `to` (send/recv; every rank must call it). Then
        state_dict() there is a plain optimizer's over all parameters."""
        g = self.process_group
        dst = g.group_rank(to, "consolidate_state_dict")
        mine = {}  # full name -> tensor, of what this rank owns
        if self._local is not None:
            for name, t in self._local.state_dict()["tensors"].items():
                mine[self._full_name(name)] = t
        # What each owner holds (state can appear lazily, as SGD's momentum), through the store.
        g._zero_consolidations = getattr(g, "_zero_consolidations", 0) + 1  # per group: every optimizer on it
        key = f"{g.name}/zero/{g._zero_consolidations}"
        g._store.set(f"{key}/{g.rank}", json.dumps({n: [list(t.shape), t.dtype] for n, t in mine.items()}).encode())
        gathered = {n: t.clone() for n, t in mine.items()} if g.rank == dst else {}
        for r in range(g.size):
            if r == dst:
                continue
            if g.rank == r:
                for name in sorted(mine):
                    send(mine[name], g.ranks[dst], g)
            elif g.rank == dst:
                held = json.loads(g._store.get(f"{key}/{r}"))
                for name in sorted(held):
                    shape, dtype = held[name]
                    device = self._all[int(_INDEXED.match(name).group(2))].device
                    gathered[name] = recv(empty(tuple(shape), dtype=dtype, device=device), g.ranks[r], g)
        if g.rank != dst:
            self._consolidated = None
            return
        groups, start = [], 0
        for pg in self.param_groups:
            n = len(pg["params"])
            groups.append({**{k: v for k, v in pg.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        self._consolidated = {"param_groups": groups, "step": self.step_count, "lr": self.lr, "tensors": gathered}

    def state_dict(self):
        if self._consolidated is None:
            raise RuntimeError(
                "ZeroRedundancyOptimizer.state_dict(): call consolidate_state_dict(to=r) on every rank first, "
                "then state_dict() on rank r"
            )
        return self._consolidated

    def load_state_dict(self, state):
        """Loads a plain optimizer's state over all the parameters (consolidated, from any number of ranks):
        each rank takes what it owns."""
        tensors = state.get("tensors")
        if tensors is None:
            raise ValueError("ZeroRedundancyOptimizer.load_state_dict: expected state_dict()'s layout with 'tensors'")
        saved = state.get("param_groups")
        if saved is not None:
            sizes = [len(s["params"]) for s in saved]
            if sizes != [len(pg["params"]) for pg in self.param_groups]:
                raise ValueError(f"optimizer state does not fit: parameter groups of {sizes}")
            for pg, s in zip(self.param_groups, saved, strict=True):
                pg.update({k: (tuple(v) if k == "betas" else v) for k, v in s.items() if k != "params"})
        step = int(state["step"])
        if self._local is None:
            self._steps = step
            return
        local_index = {i: j for j, i in enumerate(self._mine)}
        mine = {}
        for name, t in tensors.items():
            m = _INDEXED.match(name)
            if m is None:
                raise KeyError(f"optimizer state: unexpected tensor {name!r}")
            i = int(m.group(2))
            if i >= len(self._all):
                raise KeyError(f"optimizer state: {name!r} is for parameter {i} of {len(self._all)}")
            if i in local_index:
                mine[f"{m.group(1)}.{local_index[i]}"] = t
        self._local.load_state_dict({"tensors": mine, "step": step, "lr": self.lr})

    def _full_name(self, local_name):
        m = _INDEXED.match(local_name)
        return f"{m.group(1)}.{self._mine[int(m.group(2))]}"


def partition(params, n):
    """Owner (group rank) of each parameter: the largest first, each to the least loaded rank."""
    load = [0] * n
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = load.index(min(load))
        owner[i] = r
        load[r] += params[i].numel()
    return owner

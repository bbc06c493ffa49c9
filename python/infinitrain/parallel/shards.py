"""Checkpoints of a parallel run: one shard per model-parallel rank (tensor x pipeline), written by the first
data-parallel replica, and a merge back into the single-device model's tensors.

    ckpt_00000100.bin             rank 0's shard, with the run's meta and its layout
    ckpt_00000100.bin.shard001    model-parallel rank 1's shard (its meta says which part it is), ...

Each shard holds its parameters under the full model's names ("model.<name>") and its optimizer's state
("optim.<kind>.<i>", i indexing shard["params"]); shard["specs"] says how each part sits in the full tensor
(layers.Spec). A run reloads its own layout; `merge` makes a plain checkpoint (model and optimizer state in the
single-device layout) that any layout or one device can start from.
"""

import json
import os
import re

import numpy as np

from infinitrain import checkpoint
from infinitrain.parallel.layers import Spec, piece

_INDEXED = re.compile(r"^(.*)\.(\d+)$")


def shard_path(main, index):
    return main if index == 0 else f"{main}.shard{index:03d}"


def layout_meta(layout):
    return {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "sp": layout.sp, "dp": layout.dp,
            "schedule": layout.schedule}  # fmt: skip


def shard_tensors(model, optimizer_state, grid, with_optimizer=True):
    """(tensors, shard meta) of this rank's part; optimizer_state: the (consolidated) optimizer state_dict."""
    params = model.shard_parameters()
    tensors = {f"model.{n}": p.numpy() for n, p in params}
    if with_optimizer and optimizer_state is not None:
        tensors.update({f"optim.{k}": np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                        for k, v in optimizer_state["tensors"].items()})  # fmt: skip
    L = model.layout
    index = grid.stage * L.tp + grid.tp_rank if grid is not None else 0
    specs = model.specs()
    meta = {
        "index": index,
        "of": L.pp * L.tp,
        "stage": grid.stage if grid is not None else 0,
        "tp_rank": grid.tp_rank if grid is not None else 0,
        "params": [n for n, _ in params],
        "specs": {n: specs[n].to_json() for n, _ in params},
        "split": model.split,
    }
    return tensors, meta


def _local_pieces(spec, tp, r):
    """[(segment, piece index, local start, local end)] of tp rank r's tensor along spec.dim."""
    out, at = [], 0
    for j, (full, n) in enumerate(spec.segments):
        i = r * n // tp
        a, b = piece(full, n, i)
        out.append((j, i, at, at + b - a))
        at += b - a
    return out


def merge_tensor(spec, parts, tp):
    """The full tensor from {tp rank: local array} (every piece's first holder present)."""
    if spec.owner is not None:  # an expert: its owner holds it whole
        full = np.asarray(parts[spec.owner])
        if tuple(full.shape) != spec.full_shape:
            raise ValueError(f"merging shards: got shape {full.shape}, the spec says {spec.full_shape}")
        return full
    segments = []
    for j, (full, n) in enumerate(spec.segments):
        pieces = []
        for i in range(n):
            if piece(full, n, i)[0] == piece(full, n, i)[1]:
                continue
            r = i * tp // n
            local = parts[r]
            _, _, a, b = _local_pieces(spec, tp, r)[j]
            pieces.append(np.take(local, np.arange(a, b), axis=spec.dim))
        segments.append(np.concatenate(pieces, axis=spec.dim))
    full = np.concatenate(segments, axis=spec.dim) if len(segments) > 1 else segments[0]
    if tuple(full.shape) != spec.full_shape:
        raise ValueError(f"merging shards: got shape {full.shape}, the spec says {spec.full_shape}")
    return full


def read_shards(main):
    """[(tensors, meta)] of every shard of the checkpoint whose main file is `main`, in shard order."""
    tensors, meta = checkpoint.load(main)
    shard = meta.get("shard")
    if shard is None:
        raise ValueError(f"{main} is not a sharded checkpoint (no shard meta)")
    out = [(tensors, meta)]
    for k in range(1, shard["of"]):
        path = shard_path(main, k)
        if not os.path.exists(path):
            raise ValueError(f"{main}: its shard {k} of {shard['of']} ({path}) is missing")
        out.append(checkpoint.load(path))
    return out


def merge(main, full_param_names):
    """(model tensors, optimizer tensors) of the full model from a sharded checkpoint: names as the single-device
    model's state_dict; optimizer state indexed by full_param_names (the single-device optimizer's order)."""
    shards = read_shards(main)
    layout = shards[0][1]["layout"]
    tp = layout["tp"]
    by_name = {}  # name -> (spec, {tp rank: model array}, {kind: {tp rank: optimizer array}})
    for tensors, meta in shards:
        sh = meta["shard"]
        r = sh["tp_rank"]
        for i, name in enumerate(sh["params"]):
            spec = Spec.from_json(sh["specs"][name])
            if spec.tied:
                continue  # the last stage's copy of the embedding: the first stage's is the same
            entry = by_name.setdefault(name, (spec, {}, {}))
            entry[1][r] = tensors[f"model.{name}"]
            for key, value in tensors.items():
                if key.startswith("optim."):
                    m = _INDEXED.match(key[len("optim.") :])
                    if m and int(m.group(2)) == i:
                        entry[2].setdefault(m.group(1), {})[r] = value
    model = {name: merge_tensor(spec, parts, tp) for name, (spec, parts, _) in by_name.items()}
    missing = [n for n in full_param_names if n not in model]
    if missing:
        raise ValueError(f"merging {main}: no shard holds {missing[:5]}")
    optim = {}
    for idx, name in enumerate(full_param_names):
        spec, _, kinds = by_name[name]
        for kind, parts in kinds.items():
            optim[f"{kind}.{idx}"] = merge_tensor(spec, parts, tp)
    return model, optim


def merged_checkpoint(main, full_param_names):
    """(tensors, meta) of a plain checkpoint equal to the sharded one at `main`."""
    _, meta = checkpoint.load(main)
    model, optim = merge(main, full_param_names)
    tensors = {f"model.{k}": v for k, v in model.items()}
    tensors.update({f"optim.{k}": v for k, v in optim.items()})
    meta = {k: v for k, v in meta.items() if k not in ("shard", "layout")}
    meta["merged_from"] = {"path": os.path.abspath(main), "layout": checkpoint.load(main)[1]["layout"]}
    if not optim:
        meta["optimizer"] = dict(meta["optimizer"], saved=False)
    return tensors, meta


def describe(meta):
    lay = meta.get("layout") or {}
    return json.dumps(lay, sort_keys=True)


def local_part(spec, full, tp, r):
    """Tensor-parallel rank r's part of a full array (the inverse of merge_tensor)."""
    full = np.asarray(full)
    parts = [np.take(full, np.arange(a, b), axis=spec.dim) for a, b, _ in spec.local_ranges(tp, r)]
    return np.concatenate(parts, axis=spec.dim) if len(parts) > 1 else parts[0]


def from_plain(model, grid, tensors, full_param_names):
    """(model tensors, optimizer tensors) of this rank's parts from a plain checkpoint's tensors (single-device
    or merged): optimizer state indexed as the plain optimizer over full_param_names."""
    specs = model.specs()
    tp, r = model.layout.tp, (grid.tp_rank if grid is not None else 0)
    full_index = {n: i for i, n in enumerate(full_param_names)}
    mine, optim = {}, {}
    for j, (name, _) in enumerate(model.shard_parameters()):
        key = f"model.{name}"
        if key not in tensors:
            raise KeyError(f"the checkpoint has no {name}")
        mine[name] = local_part(specs[name], tensors[key], tp, r)
        i = full_index[name]
        for k, v in tensors.items():
            m = _INDEXED.match(k[len("optim.") :]) if k.startswith("optim.") else None
            if m and int(m.group(2)) == i:
                optim[f"{m.group(1)}.{j}"] = local_part(specs[name], v, tp, r)
    return mine, optim

"""Module, Parameter and the standard layers."""

import math
from collections import OrderedDict

import numpy as np

from infinitrain import functional as F
from infinitrain.tensor import Tensor, empty, from_numpy


class Parameter(Tensor):
    """A tensor that a Module registers as trainable."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data._t if isinstance(data, Tensor) else data, requires_grad)


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting attributes")
        if isinstance(value, Parameter):
            params[name] = value
            self._modules.pop(name, None)
        elif isinstance(value, Module):
            self._modules[name] = value
            params.pop(name, None)
        else:
            if name in params:
                if value is not None:
                    raise TypeError(f"cannot assign {type(value).__name__} to parameter '{name}' (expected Parameter)")
                del params[name]
            self._modules.pop(name, None)
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal ----
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self):
        seen = set()
        for mname, m in self.named_modules():
            for pname, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ---- state ----
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def to(self, *args, **kwargs):
        """Moves or casts parameters in place (the Parameter objects are kept)."""
        for p in self.parameters():
            p._t = p.to(*args, **kwargs)._t
            p.grad = None
        return self

    def state_dict(self):
        """name -> Tensor (shared with the module; tied parameters appear once)."""
        return OrderedDict(self.named_parameters())

    def load_state_dict(self, state, strict=True):
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in own.items():
            if name not in state:
                continue
            v = state[name]
            shape = tuple(v.shape)
            if shape != p.shape:
                raise ValueError(f"load_state_dict: '{name}' has shape {shape}, the module expects {p.shape}")
            if isinstance(v, Tensor):
                p.copy_(v)
            else:
                p.copy_(from_numpy(np.asarray(v), dtype=p.dtype, device=p.device))
        return missing, unexpected

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


def _init(shape, std, device, dtype, generator=None):
    return Parameter(empty(*shape, dtype=dtype, device=device).normal_(0.0, std, generator))


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device="cpu", dtype="float32", std=None):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}")
        self.in_features, self.out_features = in_features, out_features
        std = 1.0 / math.sqrt(in_features) if std is None else std
        self.weight = _init((out_features, in_features), std, device, dtype)
        self.bias = Parameter(empty(out_features, dtype=dtype, device=device).zero_()) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def __repr__(self):
        return f"Linear({self.in_features}, {self.out_features}, bias={self.bias is not None})"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device="cpu", dtype="float32", std=1.0):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = _init((num_embeddings, embedding_dim), std, device, dtype)

    def forward(self, index):
        return F.embedding(index, self.weight)

    def __repr__(self):
        return f"Embedding({self.num_embeddings}, {self.embedding_dim})"


class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5, device="cpu", dtype="float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(empty(dim, dtype=dtype, device=device).fill_(1.0))
        self.bias = Parameter(empty(dim, dtype=dtype, device=device).zero_())

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, dim, eps=1e-5, device="cpu", dtype="float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(empty(dim, dtype=dtype, device=device).fill_(1.0))

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)


class Dropout(Module):
    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        setattr(self, str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Sequential(ModuleList):
    def __init__(self, *modules):
        super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x

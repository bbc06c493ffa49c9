"""Module, Parameter and the standard layers."""

import math
from collections import OrderedDict

import numpy as np

from infinitrain import autograd
from infinitrain import functional as F
from infinitrain.nn import functional as nnF
from infinitrain.tensor import DTYPES, Tensor, empty, from_numpy


class Parameter(Tensor):
    """A tensor that a Module registers as trainable."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data._t if isinstance(data, Tensor) else data, requires_grad)


class _RemovableHandle:
    def __init__(self, table, key):
        self._table, self._key = table, key

    def remove(self):
        self._table.pop(self._key, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class Module:
    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"Module.__init__() takes no arguments, got {len(args)} positional and {sorted(kwargs)}")
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting attributes")
        buffers = self.__dict__.get("_buffers", {})
        if isinstance(value, Parameter):
            params[name] = value
            self._modules.pop(name, None)
            buffers.pop(name, None)
        elif isinstance(value, Module):
            self._modules[name] = value
            params.pop(name, None)
            buffers.pop(name, None)
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer '{name}' (expected a Tensor or None)")
            buffers[name] = value
        else:
            if name in params:
                if value is not None:
                    raise TypeError(f"cannot assign {type(value).__name__} to parameter '{name}' (expected Parameter)")
                del params[name]
            self._modules.pop(name, None)
        object.__setattr__(self, name, value)

    def register_buffer(self, name, tensor, persistent=True):
        """A tensor the module keeps and moves with it but does not train; persistent ones are in state_dict."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: '{name}' must be a Tensor or None, got {type(tensor).__name__}")
        if "." in name or not name:
            raise KeyError(f"register_buffer: bad buffer name {name!r}")
        self._buffers[name] = tensor
        (self._non_persistent.discard if persistent else self._non_persistent.add)(name)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: '{name}' must be a Parameter or None")
        if param is None:
            self._parameters[name] = None
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def add_module(self, name, module):
        setattr(self, name, module)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        try:
            hooks = self.__dict__.get("_hooks")
            if hooks is None:
                return self.forward(*args, **kwargs)
            for hook in list(hooks["pre"].values()):
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
            out = self.forward(*args, **kwargs)
            for hook in list(hooks["post"].values()):
                r = hook(self, args, out)
                if r is not None:
                    out = r
            return out
        except TypeError as e:  # a native op handed a meta tensor: said plainly (free while nothing is raised)
            if "<meta tensor" not in str(e):
                raise
            raise RuntimeError(
                f"{type(self).__name__}: a tensor it uses is on device 'meta' (no data): a model built there runs "
                "once FullyShardedDataParallel has materialised it on a device (--zero_stage=3)"
            ) from None

    def _hook_table(self):
        hooks = self.__dict__.get("_hooks")
        if hooks is None:
            hooks = {"pre": OrderedDict(), "post": OrderedDict(), "next": 0}
            object.__setattr__(self, "_hooks", hooks)
        return hooks

    def _add_hook(self, kind, fn):
        hooks = self._hook_table()
        key = hooks["next"]
        hooks["next"] += 1
        hooks[kind][key] = fn
        return _RemovableHandle(hooks[kind], key)

    def register_forward_pre_hook(self, hook):
        """hook(module, args) runs before forward; a returned value replaces the positional arguments."""
        return self._add_hook("pre", hook)

    def register_forward_hook(self, hook):
        """hook(module, args, output) runs after forward; a returned value replaces the output."""
        return self._add_hook("post", hook)

    def register_module(self, name, module):
        self.add_module(name, module)

    def __delattr__(self, name):
        for table in ("_parameters", "_buffers", "_modules"):
            d = self.__dict__.get(table)
            if d is not None and name in d:
                del d[name]
        object.__delattr__(self, name)

    # ---- traversal ----
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def get_submodule(self, target):
        m = self
        for part in target.split(".") if target else ():
            if part not in m._modules:
                raise AttributeError(f"{type(m).__name__} has no submodule '{part}' (in '{target}')")
            m = m._modules[part]
        return m

    def apply(self, fn):
        """Calls fn(module) on every submodule (children first) and on itself, as PyTorch; returns self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, m in modules:
            for pname, p in m._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True):
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, m in modules:
            for bname, b in m._buffers.items():
                if b is not None:
                    yield (f"{mname}.{bname}" if mname else bname), b

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ---- state ----
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def to(self, *args, **kwargs):
        """Moves parameters and buffers to a device and casts floating ones to a dtype, in place (the Parameter
        objects are kept), as PyTorch's Module.to."""
        dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
        for a in args:
            if a in DTYPES:
                dtype = a
            else:
                device = a
        non_blocking = kwargs.pop("non_blocking", False)
        if kwargs:
            raise TypeError(f"to() got unexpected arguments {sorted(kwargs)}")

        def moved(t):
            want = dtype if dtype is not None and t.is_floating_point() else None
            return t.to(device=device, dtype=want, non_blocking=non_blocking)

        for p in self.parameters():
            p._t = moved(p)._t
            p.grad = None
        for m in self.modules():
            for b in m._buffers.values():
                if b is not None:
                    b._t = moved(b)._t
        return self

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device))

    def type(self, dst_type):
        return self.to(dst_type)

    def float(self):
        return self.to("float32")

    def double(self):
        return self.to("float64")

    def half(self):
        return self.to("float16")

    def bfloat16(self):
        return self.to("bfloat16")

    def _state_items(self):
        """(name, tensor) of every parameter and persistent buffer, tied ones under each name (PyTorch's)."""
        for mname, m in self.named_modules():
            pre = f"{mname}." if mname else ""
            for pname, p in m._parameters.items():
                if p is not None:
                    yield pre + pname, p
            for bname, b in m._buffers.items():
                if b is not None and bname not in m._non_persistent:
                    yield pre + bname, b

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """name -> Tensor, shared with the module: parameters and persistent buffers; a tied parameter appears
        under each of its names, as in PyTorch. keep_vars=False gives detached tensors, as PyTorch's."""
        out = OrderedDict() if destination is None else destination
        for k, v in self._state_items():
            out[prefix + k] = v if keep_vars else v.detach()
        return out

    def load_state_dict(self, state, strict=True, assign=False):
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
            with autograd.no_grad():
                if isinstance(v, Tensor):
                    p.copy_(v)
                else:
                    p.copy_(from_numpy(np.asarray(v), dtype=p.dtype, device=p.device))
        return missing, unexpected

    def extra_repr(self):
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        lines = [f"{type(self).__name__}(" + extra]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return "\n".join(lines) + "\n)" if len(lines) > 1 else f"{type(self).__name__}({extra})"


def _init(shape, std, device, dtype, generator=None):
    return Parameter(empty(*shape, dtype=dtype, device=device).normal_(0.0, std, generator))


def _uniform(shape, bound, device, dtype):
    return Parameter(empty(*shape, dtype=dtype, device=device).uniform_(-bound, bound))


class Linear(Module):
    """y = x W^T + b. Initialised as PyTorch's (uniform in +-1/sqrt(in_features), weight and bias) unless `std`
    asks for N(0, std^2) weights and a zero bias (GPT-2's scheme, which the models use)."""

    def __init__(self, in_features, out_features, bias=True, device="cpu", dtype="float32", std=None):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}")
        self.in_features, self.out_features = in_features, out_features
        device, dtype = device or "cpu", dtype or "float32"
        if std is None:
            bound = 1.0 / math.sqrt(in_features)
            self.weight = _uniform((out_features, in_features), bound, device, dtype)
            self.bias = _uniform((out_features,), bound, device, dtype) if bias else None
        else:
            self.weight = _init((out_features, in_features), std, device, dtype)
            self.bias = Parameter(empty(out_features, dtype=dtype, device=device).zero_()) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def __repr__(self):
        return f"Linear({self.extra_repr()})"


class Embedding(Module):
    """weight[ids] for int64 or int32 ids; N(0, 1) init as PyTorch (std overrides), padding_idx's row zero."""

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        padding_idx=None,
        max_norm=None,
        norm_type=2.0,
        scale_grad_by_freq=False,
        sparse=False,
        _weight=None,
        _freeze=False,
        device=None,
        dtype=None,
        *,
        std=1.0,
    ):
        super().__init__()
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: max_norm, scale_grad_by_freq and sparse are not supported")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} is out of range for {num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        if _weight is not None:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight must be [{num_embeddings}, {embedding_dim}], got {_weight.shape}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)
            return
        self.weight = _init((num_embeddings, embedding_dim), std, device or "cpu", dtype or "float32")
        if _freeze:
            self.weight.requires_grad = False
        if padding_idx is not None:
            with autograd.no_grad():
                self.weight[padding_idx] = 0.0

    def forward(self, index):
        if self.padding_idx is None:
            return F.embedding(index, self.weight)
        return nnF.embedding(index, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

    def __repr__(self):
        return f"Embedding({self.extra_repr()})"


def _norm_shape(normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or any(int(d) < 1 for d in shape):
        raise ValueError(f"normalized_shape must be positive sizes, got {normalized_shape!r}")
    return shape


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device="cpu", dtype="float32"):
        super().__init__()
        self.normalized_shape, self.eps = _norm_shape(normalized_shape), eps
        device, dtype = device or "cpu", dtype or "float32"
        if elementwise_affine:
            self.weight = Parameter(empty(*self.normalized_shape, dtype=dtype, device=device).fill_(1.0))
            self.bias = Parameter(empty(*self.normalized_shape, dtype=dtype, device=device).zero_()) if bias else None
        else:
            self.weight = self.bias = None

    def _one_op(self):
        return len(self.normalized_shape) == 1 and self.weight is not None and self.bias is not None

    # The module protocol of it.compile's fusion (infinitrain/fusion.py): True when several linears read this
    # norm's output, so it stays float32 under autocast (their input gradients then meet in float32).
    keep_float32_output = False

    def forward(self, x):
        if self._one_op():
            return F.layer_norm(x, self.weight, self.bias, self.eps, low_output=not self.keep_float32_output)
        return nnF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class RMSNorm(Module):
    """eps=None: the input dtype's machine epsilon, as PyTorch."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device="cpu", dtype="float32"):
        super().__init__()
        self.normalized_shape, self.eps = _norm_shape(normalized_shape), eps
        device, dtype = device or "cpu", dtype or "float32"
        self.weight = (
            Parameter(empty(*self.normalized_shape, dtype=dtype, device=device).fill_(1.0))
            if elementwise_affine
            else None
        )

    def _one_op(self):
        return len(self.normalized_shape) == 1 and self.weight is not None and self.eps is not None

    keep_float32_output = False  # as LayerNorm's

    def forward(self, x):
        if self._one_op():
            return F.rms_norm(x, self.weight, self.eps, low_output=not self.keep_float32_output)
        return nnF.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class _Elementwise(Module):
    fn = None

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, x):
        return type(self).fn(x)


class ReLU(_Elementwise):
    fn = staticmethod(F.relu)


class SiLU(_Elementwise):
    fn = staticmethod(F.silu)


class Tanh(_Elementwise):
    fn = staticmethod(F.tanh)


class Sigmoid(_Elementwise):
    fn = staticmethod(F.sigmoid)


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(x, self.dim)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        d = self.dim % x.ndim
        return x.reshape(x.shape[:d] + self.unflattened_size + x.shape[d + 1 :])


class CrossEntropyLoss(Module):
    def __init__(
        self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0
    ):
        super().__init__()
        self.weight = weight
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class MSELoss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        setattr(self, str(len(self._modules)), m)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i):
        items = list(self._modules.values())
        return ModuleList(items[i]) if isinstance(i, slice) else items[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ParameterList(Module):
    """Parameters in a list, registered as "0", "1", ... (tensors are wrapped as Parameters)."""

    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def append(self, value):
        setattr(self, str(len(self._parameters)), value if isinstance(value, Parameter) else Parameter(value))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def __getitem__(self, i):
        items = list(self._parameters.values())
        return ParameterList(items[i]) if isinstance(i, slice) else items[i]

    def __setitem__(self, i, value):
        setattr(self, str(i % len(self)), value if isinstance(value, Parameter) else Parameter(value))

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())


class ParameterDict(Module):
    """Parameters by name (tensors are wrapped as Parameters)."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def update(self, parameters):
        for k, v in parameters.items() if hasattr(parameters, "items") else parameters:
            self[k] = v

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        setattr(self, key, value if isinstance(value, Parameter) else Parameter(value))

    def __delitem__(self, key):
        del self._parameters[key]
        object.__delattr__(self, key)

    def __contains__(self, key):
        return key in self._parameters

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules):
        items = modules.items() if hasattr(modules, "items") else modules
        for k, m in items:
            self[k] = m

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict values must be Modules, got {type(module).__name__} for '{key}'")
        setattr(self, key, module)

    def __delitem__(self, key):
        del self._modules[key]
        object.__delattr__(self, key)

    def __contains__(self, key):
        return key in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()


class Sequential(ModuleList):
    def __init__(self, *modules):
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            super().__init__()
            for k, m in modules[0].items():
                setattr(self, k, m)
        else:
            super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x

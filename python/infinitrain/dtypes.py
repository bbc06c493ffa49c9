"""dtypes: each is its name, a `str` (so "float32" and `it.float32` are interchangeable and pass to the core as they
are), with PyTorch's dtype attributes; `it.finfo`, `it.iinfo` and the default float dtype."""

import numpy as np


class dtype(str):  # noqa: N801 (PyTorch's name: `isinstance(x, it.dtype)`)
    __slots__ = ()

    @property
    def is_floating_point(self):
        return self in ("float16", "bfloat16", "float32", "float64") or self in FLOAT8

    @property
    def is_complex(self):
        return False

    @property
    def is_signed(self):
        return self not in ("bool", "uint8")

    @property
    def itemsize(self):
        return _ITEMSIZE[self]

    def to_real(self):
        return self

    def __repr__(self):
        return f"infinitrain.{str.__str__(self)}"

    def __reduce__(self):
        return (dtype, (str(self),))


# The dtypes ops compute with; the float8 ones only hold FP8 GEMM operands (cast, fp8_quantize, fp8_matmul).
NAMES = ("bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
# NumPy has no type for these: they travel to and from NumPy as float32 values.
FLOAT32_CARRIED = ("bfloat16",) + FLOAT8
_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2}
_ITEMSIZE.update({"float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1})
BY_NAME = {n: dtype(n) for n in NAMES + FLOAT8}


def of(name):
    """The dtype object of a dtype name (raises KeyError for other strings)."""
    return BY_NAME[name]


_default = ["float32"]


def get_default_dtype():
    return BY_NAME[_default[0]]


def set_default_dtype(d):
    """The dtype of floating tensors made from Python floats and of the creation functions' default: float32 or
    float64, as PyTorch allows."""
    if d not in ("float32", "float64"):
        raise TypeError(f"set_default_dtype: only float32 and float64 are supported, got {d!r}")
    _default[0] = str(d)


# eps, max, smallest normal (as PyTorch's finfo gives them).
_FLOAT8_LIMITS = {"float8_e4m3fn": (0.125, 448.0, 2.0**-6), "float8_e5m2": (0.25, 57344.0, 2.0**-14)}


class finfo:  # noqa: N801
    """Machine limits of a float dtype: bits, eps, max, min, tiny (smallest normal), resolution."""

    def __init__(self, type=None):  # noqa: A002 (PyTorch's parameter name)
        name = str(type or get_default_dtype())
        if name == "bfloat16":
            self.bits, self.eps, self.max, self.tiny, self.resolution = (
                16,
                2.0**-7,
                3.3895313892515355e38,
                2.0**-126,
                0.01,
            )
        elif name in _FLOAT8_LIMITS:
            self.bits, self.eps, self.max, self.tiny = (8, *_FLOAT8_LIMITS[name])
            self.resolution = {"float8_e4m3fn": 0.1, "float8_e5m2": 1.0}[name]
        elif name in ("float16", "float32", "float64"):
            f = np.finfo(name)
            self.bits, self.eps, self.max = f.bits, float(f.eps), float(f.max)
            self.tiny, self.resolution = float(f.tiny), float(f.resolution)
        else:
            raise TypeError(f"finfo: {name} is not a floating dtype")
        self.min = -self.max
        self.smallest_normal = self.tiny
        self.dtype = name

    def __repr__(self):
        return (
            f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, eps={self.eps}, dtype={self.dtype})"
        )


class iinfo:  # noqa: N801
    """Limits of an integer dtype: bits, min, max."""

    def __init__(self, type):  # noqa: A002
        name = str(type)
        if name not in ("uint8", "int8", "int32", "int64", "bool"):
            raise TypeError(f"iinfo: {name} is not an integer dtype")
        i = np.iinfo("uint8" if name == "bool" else name)
        self.bits, self.min, self.max, self.dtype = i.bits, int(i.min), int(i.max), name

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"

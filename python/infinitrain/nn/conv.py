"""Convolutions over 1 and 2 spatial dims (nn.functional.conv1d/conv2d: index selection and one matmul)."""

import math

from infinitrain.nn import functional as nnF
from infinitrain.nn import init
from infinitrain.nn.modules import Module, Parameter
from infinitrain.tensor import empty


class _ConvNd(Module):
    def __init__(
        self,
        nd,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        bias,
        padding_mode,
        device,
        dtype,
    ):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError("in_channels and out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise NotImplementedError(f"padding_mode={padding_mode!r}: only 'zeros' is supported")
        k = nnF._tuple(kernel_size, nd)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.stride, self.dilation = nnF._tuple(stride, nd), nnF._tuple(dilation, nd)
        self.padding = padding if isinstance(padding, str) else nnF._tuple(padding, nd)
        self.groups, self.padding_mode = groups, padding_mode
        device, dtype = device or "cpu", dtype or "float32"
        self.weight = Parameter(empty(out_channels, in_channels // groups, *k, dtype=dtype, device=device))
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # PyTorch's default
        if bias:
            fan_in = (in_channels // groups) * math.prod(k)
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            self.bias = Parameter(empty(out_channels, dtype=dtype, device=device))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None

    def extra_repr(self):
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}"
        )


class Conv1d(_ConvNd):
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        super().__init__(
            1,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def forward(self, x):
        return nnF.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        super().__init__(
            2,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def forward(self, x):
        return nnF.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

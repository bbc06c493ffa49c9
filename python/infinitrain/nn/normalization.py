"""GroupNorm (LayerNorm and RMSNorm are in modules.py)."""

from infinitrain.nn import functional as nnF
from infinitrain.nn.modules import Module, Parameter
from infinitrain.tensor import ones, zeros


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-05, affine=True, device=None, dtype=None, bias=True):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        device, dtype = device or "cpu", dtype or "float32"
        if affine:
            self.weight = Parameter(ones(num_channels, dtype=dtype, device=device))
            self.bias = Parameter(zeros(num_channels, dtype=dtype, device=device)) if bias else None
        else:
            self.weight = self.bias = None

    def forward(self, x):
        return nnF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"

"""Providers: out-of-tree accelerators in the PrivateUse1 device slot.

A provider built into this package is a Python module named
``infinitrain_<name>`` whose ``register_backend()`` claims the slot. It
registers when you call ``register(name)``, or on first use of its device
name (``it.randn(3, device="sim:1")``). One provider per process.
"""

import importlib
import pkgutil

from infinitrain import _C

PREFIX = "infinitrain_"


def available():
    """Names of the providers this build contains (importable modules ``infinitrain_<name>``)."""
    return sorted(m.name[len(PREFIX) :] for m in pkgutil.iter_modules() if m.name.startswith(PREFIX))


def registered():
    """The registered provider: {'name', 'autocast_dtype'}, or None."""
    return _C.privateuse1()


def set_cpu_fallback(name, on=True):
    """Lets provider `name` run ops it has no kernel and no composite for on the CPU (copying inputs to
    the host and outputs back, warning once per op): a bring-up aid, off by default."""
    _C.set_cpu_fallback(name, bool(on))


def cpu_fallback(name):
    return _C.cpu_fallback(name)


def register(name):
    """Imports provider `name` and registers it (idempotent); returns what it registered."""
    try:
        module = importlib.import_module(PREFIX + name)
    except ModuleNotFoundError:
        built = ", ".join(available()) or "none"
        raise ValueError(
            f"no provider named '{name}' in this build (built-in providers: {built}); " f"build with --config={name}"
        ) from None
    module.register_backend()
    return registered()


def _resolve(name):
    """Called by the core for an unknown device name while no provider is registered: registers the provider
    of that name if this build has one, else raises an error listing what exists."""
    if name not in available():
        built = ", ".join(available()) or "none"
        raise ValueError(
            f"unknown device type '{name}': known types are cpu and the providers built in ({built}), "
            f"which register on first use; a provider is built in with --config=<name>, e.g. "
            f"`./bazelw run --config={name} //python:train -- --device={name}:0` or "
            f"`./bazelw run --config={name} //python:develop`"
        )
    register(name)
    return True


# ---- PyTorch's torch.backends switches -------------------------------------------------------------------------


class _Matmul:
    """`it.backends.<device>.matmul`: allow_tf32 is the process's float32 matmul precision ("high" when on), which
    providers with reduced-precision tensor cores read at every GEMM (TF32 on CUDA GPUs); off by default, as
    PyTorch's."""

    @property
    def allow_tf32(self):
        return _C.float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, on):
        _C.set_float32_matmul_precision("high" if on else "highest")

    # Reduced-precision reductions inside 16-bit GEMMs: accepted; the GEMMs here always accumulate in float32.
    allow_bf16_reduced_precision_reduction = False
    allow_fp16_reduced_precision_reduction = False


class _DeviceBackend:
    """`it.backends.cuda` (and any provider's name): the matmul switch and the attention-kernel switches."""

    def __init__(self, name):
        self._name = name
        self.matmul = _Matmul()
        self._sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}

    def is_built(self):
        return self._name in available()

    # Attention kernels: the provider picks its fused kernel whenever one applies, so these are recorded only.
    def enable_flash_sdp(self, on):
        self._sdp["flash"] = bool(on)

    def enable_mem_efficient_sdp(self, on):
        self._sdp["mem_efficient"] = bool(on)

    def enable_math_sdp(self, on):
        self._sdp["math"] = bool(on)

    def enable_cudnn_sdp(self, on):
        self._sdp["cudnn"] = bool(on)

    def flash_sdp_enabled(self):
        return self._sdp["flash"]

    def mem_efficient_sdp_enabled(self):
        return self._sdp["mem_efficient"]

    def math_sdp_enabled(self):
        return self._sdp["math"]

    def cudnn_sdp_enabled(self):
        return self._sdp["cudnn"]


class _Library:
    """`it.backends.cudnn` and the other library switches PyTorch scripts set. allow_tf32 (True by default, as
    PyTorch's) governs float32 ops that a provider runs in a vendor library with TF32 modes; no provider here runs a
    float32 op in one, so it changes no result. benchmark and deterministic are recorded: kernels here are chosen
    per shape without timing, and give the same bits run to run."""

    def __init__(self, name):
        self._name = name
        self.allow_tf32 = True
        self.benchmark = False
        self.deterministic = False
        self.enabled = True

    def is_available(self):
        return bool(available())

    def version(self):
        return None


cuda = _DeviceBackend("cuda")
cudnn = _Library("cudnn")
mkldnn = _Library("mkldnn")
mps = _DeviceBackend("mps")


def __getattr__(name):
    # `it.backends.<provider>` for the providers this build contains, beside PyTorch's names above.
    if name in available():
        b = _DeviceBackend(name)
        globals()[name] = b
        return b
    raise AttributeError(f"module 'infinitrain.backends' has no attribute '{name}'")

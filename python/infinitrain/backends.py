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

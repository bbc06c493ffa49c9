"""Activation recompute (activation checkpointing): a block's forward runs without keeping its intermediate
activations, and backward runs it again to get them. Memory for activations drops from every block's to one
block's at a time, for about one more forward pass of compute.

    model = GPT2(cfg)
    enable(model, blocks=list(model.h))     # --activation_recompute does this for every transformer block
"""

from infinitrain import amp, autograd, dispatch, fusion
from infinitrain import random as _random
from infinitrain.tensor import Tensor


def checkpoint(fn, *args, gather=None, release=None):
    """fn(*args), recording one graph node whose backward recomputes fn with the autocast state of the forward.

    Gradients of the parameters fn uses go straight into their .grad (they are leaves) during that backward.
    fn must return one tensor. Random ops on the default generator (LoRA's dropout) draw the same numbers in the
    recompute as in the forward: backward replays the generator state of the forward, then restores its own.
    gather(backward) runs before each run of fn and release(backward) after it (in backward: after the gradients
    are in), with backward False in the forward: ZeRO-3 materialises the block's parameters there.
    """
    gather = gather or _nothing
    release = release or _nothing
    if not autograd.is_grad_enabled():
        gather(False)
        try:
            return fn(*args)
        finally:
            release(False)
    # Under it.compile's fusion a block's input and output may be pending (infinitrain/fusion.py): they are
    # settled here, and the recompute runs with fusion as the forward did, so both build the same ops.
    args = tuple(fusion.settle(a) for a in args)
    fused = autograd.fusion.on
    cast_dtype = amp.autocast_dtype()
    rng_state = _random.default_generator.get_state()
    gather(False)
    try:
        with autograd.no_grad():
            out = fusion.settle(fn(*args))
    finally:
        release(False)
    if not isinstance(out, Tensor):
        raise TypeError(f"activation recompute needs a block that returns one tensor, got {type(out).__name__}")
    needs = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]

    def backward(grad):
        inputs = list(args)
        for i in needs:
            inputs[i] = args[i].detach().requires_grad_()
        gen = _random.default_generator
        current = gen.get_state()
        gen.set_state(rng_state)
        was = autograd.fusion.on
        autograd.fusion.on = fused
        gather(True)
        try:
            with autograd.enable_grad(), amp.autocast(dtype=cast_dtype, enabled=cast_dtype is not None):
                again = fusion.settle(fn(*inputs))
        finally:  # the recompute must not move the generator: later draws stay those of a run without it
            gen.set_state(current)
            autograd.fusion.on = was
        autograd.backward(again, grad)
        del again  # its graph holds the gathered parameters
        release(True)
        return tuple(inputs[i].grad for i in needs)

    return dispatch.record(out, tuple(args[i] for i in needs), backward, "recompute")


def _nothing(backward):
    pass


def enable(model, blocks):
    """Makes each module in `blocks` recompute its forward in backward (in place; returns the model)."""
    for block in blocks:
        forward = block.forward

        def recomputed(*args, _forward=forward):
            return checkpoint(_forward, *args)

        object.__setattr__(block, "forward", recomputed)
    return model

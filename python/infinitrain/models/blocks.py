"""Pre-norm blocks run as (residual, branch) pairs: a block's last residual add is left to the next block's first
norm, which takes it in the same op (LayerNorm.forward_add, RMSNorm.forward_add)."""


def run_split(blocks, x, *args):
    """Runs blocks on x (each block's forward_split(x, *args, pending=...)); returns (x, pending), whose sum is
    the last block's output, for the final norm's forward_add. A block whose forward was replaced (activation
    recompute) runs whole."""
    pending = None
    for block in blocks:
        if "forward" in vars(block):
            x = block(x if pending is None else x + pending, *args)
            pending = None
        else:
            x, pending = block.forward_split(x, *args, pending=pending)
    return x, pending

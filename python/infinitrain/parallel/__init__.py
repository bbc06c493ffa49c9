"""Model parallelism: tensor (Megatron-style, with sequence parallelism), pipeline (GPipe, 1F1B, interleaved 1F1B)
and data parallelism on one grid, for GPT-2, LLaMA 3 and Mixtral (its experts split across the tensor-parallel
ranks: expert parallelism).

    layout = parallel.make_layout(world, tp=2, pp=2, vpp=1, sp=True)   # the rest of the world: data parallel
    grid = parallel.Grid(layout, device)                                # this rank's groups
    model = parallel.ParallelModel(GPT2(cfg, device), layout, grid)     # this rank's part of the full model
    engine = parallel.Engine(model, grid)
    loss = engine.forward_backward([(x, y), ...])                       # micro-batches of this replica's rows
    norm = engine.finish_gradients(max_norm=1.0)
    optimizer.step()

See docs/decisions.md ("Model parallelism") for the choices made.
"""

from infinitrain.parallel import mappings, schedules
from infinitrain.parallel.engine import Engine
from infinitrain.parallel.grid import Grid
from infinitrain.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    Spec,
    TPRegion,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from infinitrain.parallel.layout import Layout, LayoutError, check_model, make_layout
from infinitrain.parallel.model import ParallelModel, split_layers

__all__ = [
    "ColumnParallelLinear",
    "Engine",
    "Grid",
    "Layout",
    "LayoutError",
    "ParallelModel",
    "RowParallelLinear",
    "Spec",
    "TPRegion",
    "VocabParallelEmbedding",
    "check_model",
    "make_layout",
    "mappings",
    "schedules",
    "split_layers",
    "vocab_parallel_cross_entropy",
]

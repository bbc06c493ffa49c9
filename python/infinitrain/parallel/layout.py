"""A parallel layout (data x pipeline x tensor, tensor innermost) and its checks against a model and a world
size, made before any work so a bad layout fails with a message naming what does not divide."""

from dataclasses import dataclass

SCHEDULES = ("1f1b", "gpipe")


class LayoutError(ValueError):
    """A layout the model or the world size cannot take."""


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    sp: bool = False
    dp: int = 1
    schedule: str = "1f1b"  # with vpp > 1: the interleaved 1F1B

    @property
    def world(self):
        return self.dp * self.pp * self.tp

    @property
    def chunks(self):
        """Model chunks (virtual stages) in all."""
        return self.pp * self.vpp

    def rank_of(self, dp, pp, tp):
        return (dp * self.pp + pp) * self.tp + tp

    def coords(self, rank):
        """(dp, pp, tp) of a global rank."""
        return rank // (self.pp * self.tp), (rank // self.tp) % self.pp, rank % self.tp

    def describe(self):
        parts = [f"DP{self.dp}", f"TP{self.tp}" + ("+SP" if self.sp else ""), f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"vPP{self.vpp}")
        return "x".join(parts)


def _positive(name, v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise LayoutError(f"{name} must be a positive integer, got {v!r}")


def make_layout(world, tp=1, pp=1, vpp=1, sp=False, schedule="1f1b"):
    """The layout of `world` ranks with these tensor/pipeline sizes; the rest is data parallel."""
    for name, v in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("virtual_pipeline_parallel", vpp)):
        _positive(name, v)
    if schedule not in SCHEDULES:
        raise LayoutError(f"pipeline schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if world % (tp * pp):
        raise LayoutError(
            f"the world size {world} is not a multiple of tensor_parallel x pipeline_parallel = {tp} x {pp}: the "
            "ranks form a data x pipeline x tensor grid"
        )
    if sp and tp == 1:
        raise LayoutError("sequence_parallel shards the sequence across the tensor-parallel group: it needs tp > 1")
    if vpp > 1 and pp == 1:
        raise LayoutError("virtual_pipeline_parallel > 1 interleaves pipeline stages: it needs pipeline_parallel > 1")
    return Layout(tp=tp, pp=pp, vpp=vpp, sp=bool(sp), dp=world // (tp * pp), schedule=schedule)


def check_model(layout, plan, config, sequence_length=None, microbatches=None):
    """Refuses a layout the model cannot be split into (heads, MLP width or experts, vocabulary, layers, sequence).
    plan: the family's TensorParallelPlan (None: the family cannot be split)."""
    if plan is None:
        raise LayoutError(
            f"tensor and pipeline parallelism are not implemented for {type(config).__name__.removesuffix('Config')} "
            "(its family has no tensor-parallel plan)"
        )
    d = plan.dims(config)
    heads, kv, layers, hidden, vocab = d.heads, d.kv_heads, d.layers, d.mlp_width, d.vocab_rows
    tp = layout.tp
    if tp > 1:
        if heads % tp:
            raise LayoutError(f"n_head={heads} is not divisible by tensor_parallel={tp}: each rank takes whole heads")
        if kv % tp and tp % kv:
            raise LayoutError(
                f"n_kv_head={kv} and tensor_parallel={tp}: the key/value heads must split evenly across the ranks "
                "or be replicated (tensor_parallel a multiple of n_kv_head)"
            )
        if hidden is not None and hidden % tp:
            raise LayoutError(f"the MLP width {hidden} is not divisible by tensor_parallel={tp}")
        if d.experts and d.experts % tp:
            raise LayoutError(
                f"num_experts={d.experts} is not divisible by tensor_parallel={tp}: each rank holds whole "
                "experts (expert parallel)"
            )
        if vocab < tp:
            raise LayoutError(f"a vocabulary of {vocab} rows cannot be split across tensor_parallel={tp} ranks")
        if layout.sp and sequence_length is not None and sequence_length % tp:
            raise LayoutError(
                f"sequence_parallel: sequence_length={sequence_length} is not divisible by tensor_parallel={tp}"
            )
    if layers < layout.chunks:
        what = f"pipeline_parallel={layout.pp}" + (
            f" x virtual_pipeline_parallel={layout.vpp}" if layout.vpp > 1 else ""
        )
        raise LayoutError(f"n_layer={layers} is fewer than the {layout.chunks} pipeline stages ({what})")
    if microbatches is not None and layout.vpp > 1 and layout.schedule == "1f1b" and microbatches % layout.pp:
        raise LayoutError(
            f"the interleaved 1F1B schedule needs the micro-batches per step ({microbatches}: total_batch_size / "
            f"(batch_size x sequence_length x data-parallel size)) to be a multiple of pipeline_parallel={layout.pp}"
        )

"""RunConfig: everything a training run is told, in one validated dataclass.

The train CLI's flags are made from its fields (help, group, bounds and choices live in each field's metadata), so
a flag, its default, its --help line and docs/train_flags.md are one definition. Python builds one directly:

    from infinitrain.training import RunConfig, Trainer
    Trainer(RunConfig(model="gpt2-tiny", num_iteration=50, input_bin="train.bin")).fit()

Checks that need only the values (ranges, choices, conflicts between flags) run when a RunConfig is made; those
that need the machine (devices, processes) run when a Trainer resolves it.
"""

import dataclasses
import math
from dataclasses import dataclass, field

from infinitrain.models import registry as models_registry
from infinitrain.optim.schedule import STYLES
from infinitrain.runs import METRICS_NAME, UsageError

# The groups --help and docs/train_flags.md list the flags in, in this order.
GROUPS = (
    ("model", "what to train"),
    ("lora", "LoRA adapters"),
    ("data", "token files and the tokenizer"),
    ("devices", "where to train"),
    ("batch", "batch, length, steps"),
    ("optimizer", "optimizer"),
    ("schedule", "learning-rate schedule"),
    ("memory", "activation memory"),
    ("evaluation", "validation and samples"),
    ("checkpoints", "checkpoints and resuming"),
    ("outputs", "metrics, logs, profiles"),
    ("parallel", "processes and model parallelism (under python -m infinitrain.run)"),
)


def flag(default, help, group, *, lower=None, upper=None, choices=None, aliases=(), neutral=None, missing=""):
    """A RunConfig field with its flag's metadata. neutral/missing: an InfiniTrain flag whose feature is not
    implemented: its neutral values are accepted, any other is refused saying what is missing."""
    meta = {"help": help, "group": group, "lower": lower, "upper": upper, "choices": choices, "aliases": aliases}
    meta.update(neutral=neutral, missing=missing)
    return field(default=default, metadata=meta)


def _model_flag(name, group):
    kind, default, help_text, lower = models_registry.FLAG_SPECS[name]
    return flag(default, help_text, group, lower=lower)


_PRESETS = ", ".join(models_registry.names())


@dataclass(frozen=True)
class RunConfig:
    # ---- model ----
    model: str = flag(
        "gpt2-tiny",
        f"Model preset: {_PRESETS} (docs/train_flags.md describes them). With --n_layer/--n_head/--n_kv_head/"
        "--n_embd, --model=gpt2 or llama3 is a custom-size model (unset shape flags: 4 layers, 4 heads, 2 kv heads, "
        "128 wide).",
        "model",
    )
    n_layer: int | None = flag(None, "Layers of a custom-size model.", "model", lower=1)
    n_head: int | None = flag(None, "Attention heads of a custom-size model.", "model", lower=1)
    n_kv_head: int | None = flag(None, "Key/value heads of a custom-size LLaMA 3.", "model", lower=1)
    n_embd: int | None = flag(None, "Width of a custom-size model.", "model", lower=1)
    vocab_size: int | None = flag(
        None, "Vocabulary size (default: the tokenizer's, else the preset's or the token file kind's).", "model",
        lower=1,
    )  # fmt: skip
    llmc_filepath: str = flag("", "Start from this llm.c model file (it fixes the model's shape).", "model")
    config_json: str = _model_flag("config_json", "model")
    init_from: str = _model_flag("init_from", "model")
    intermediate_size: int = _model_flag("intermediate_size", "model")
    num_experts: int = _model_flag("num_experts", "model")
    num_experts_per_tok: int = _model_flag("num_experts_per_tok", "model")
    router_aux_loss_coef: float | None = _model_flag("router_aux_loss_coef", "model")
    # ---- LoRA ----
    lora_rank: int = _model_flag("lora_rank", "lora")
    lora_alpha: float = _model_flag("lora_alpha", "lora")
    lora_target_modules: str = _model_flag("lora_target_modules", "lora")
    lora_dropout: float = _model_flag("lora_dropout", "lora")
    lora_save_path: str = flag("", "Save the LoRA adapters here at the end (PEFT's file names).", "lora")
    lora_load_path: str = flag(
        "", "Start from these LoRA adapters (their rank, alpha, targets and dropout come along).", "lora"
    )
    # ---- data ----
    input_bin: str = flag("", "llm.c token file to train on (default: the Shakespeare corpus).", "data")
    input_val_bin: str = flag("", "llm.c token file for validation (default: the corpus's val split).", "data")
    tokenizer_bin: str = flag(
        "", "llm.c tokenizer file or Hugging Face tokenizer.json (samples; its size is the vocabulary).", "data"
    )
    # ---- devices ----
    device: str = flag("cpu", "Device to train on: cpu, or a provider's device such as sim:0 or cuda.", "devices")
    devices: str = flag(
        "", "Data-parallel training in this process over these devices (e.g. sim:0,sim:1); overrides --device.",
        "devices",
    )  # fmt: skip
    nthread_per_process: int = flag(
        1, "InfiniTrain's data parallelism: N > 1 trains on devices 0..N-1 of --device's type.", "devices", lower=1
    )
    dtype: str = flag(
        "float32", "Compute dtype (bfloat16 autocasts matmuls).", "devices", choices=("float32", "bfloat16")
    )
    fp8: bool = flag(
        False, "The linear layers' GEMMs in FP8 (e4m3 forward, e5m2 gradients), heads kept; needs FP8 kernels.",
        "devices",
    )  # fmt: skip
    fp8_scaling: str = flag(
        "delayed", "FP8 scales from an amax history (delayed) or each tensor's own amax (current).", "devices",
        choices=("delayed", "current"),
    )  # fmt: skip
    fp8_amax_history: int = flag(16, "FP8 delayed scaling: uses of each tensor its amax history spans.", "devices",
                                 lower=1, upper=4096)  # fmt: skip
    # ---- batch ----
    batch_size: int = flag(8, "Sequences per micro-batch on each device.", "batch", lower=1)
    sequence_length: int = flag(128, "Tokens per sequence.", "batch", lower=1)
    total_batch_size: int = flag(0, "Tokens per optimizer step (0: one micro-batch).", "batch", lower=0)
    num_iteration: int = flag(
        300, "Optimizer steps (the whole run; more than a checkpoint's extends it).", "batch", lower=1
    )
    overfit_single_batch: bool = flag(False, "Train every step on the first batch(es) of the data.", "batch")
    # ---- optimizer ----
    optimizer: str = flag(
        "adamw", "adamw: betas (0.9, 0.95); adam: (0.9, 0.999); sgd.", "optimizer", choices=("adamw", "adam", "sgd")
    )
    learning_rate: float = flag(1e-3, "Peak learning rate.", "optimizer", lower=0.0)
    weight_decay: float = flag(0.0, "Weight decay (AdamW's decoupled; SGD's L2).", "optimizer", lower=0.0)
    grad_clip: float = flag(1.0, "Gradient norm clip (0: off).", "optimizer", lower=0.0)
    seed: int = flag(42, "Seed for initialisation and data order.", "optimizer", lower=0, upper=2**63 - 1)
    # ---- schedule ----
    lr_warmup_iters: int = flag(10, "Linear warmup steps.", "schedule", lower=0, aliases=("warmup_steps",))
    lr_warmup_init: float = flag(0.0, "Learning rate at the start of warmup.", "schedule", lower=0.0)
    lr_decay_style: str = flag(
        "cosine", "Decay after warmup (InfiniTrain's styles).", "schedule", choices=tuple(STYLES)
    )
    min_lr: float | None = flag(
        None, "Learning rate at the end of decay (default: --learning_rate / 10).", "schedule", lower=0.0
    )
    lr_decay_iters: int = flag(0, "Steps the warmup and decay span (0: --num_iteration).", "schedule", lower=0)
    # ---- memory ----
    activation_recompute: bool = flag(False, "Recompute each transformer block's forward in backward.", "memory")
    recompute_granularity: str = flag(
        "full", "InfiniTrain's: full (every block) is implemented; none conflicts with recompute.", "memory",
        neutral=("full", "none"), missing="selective activation recompute (full is)",
    )  # fmt: skip
    recompute_method: str = flag(
        "none", "InfiniTrain's: none or uniform with --recompute_num_layers <= 1.", "memory",
        neutral=("none", "uniform"), missing="block-wise recompute (uniform, one layer per region, is)",
    )  # fmt: skip
    recompute_num_layers: int = flag(0, "InfiniTrain's: layers per recompute region (0 or 1).", "memory", lower=0)
    # ---- evaluation ----
    val_loss_every: int = flag(
        50, "Evaluate validation loss every N steps and at the end (0: never).", "evaluation", lower=0,
        aliases=("val_every",),
    )  # fmt: skip
    val_batches: int = flag(4, "Batches per validation.", "evaluation", lower=1)
    freq_generate_txt: int = flag(
        100, "Print a generated sample every N steps (0: never).", "evaluation", lower=0, aliases=("sample_every",)
    )
    text_length: int = flag(96, "Tokens per generated sample.", "evaluation", lower=1, aliases=("sample_length",))
    # ---- checkpoints ----
    save: str = flag(
        "", "Directory for checkpoints and the run's metrics (locked while a run uses it).", "checkpoints",
        aliases=("checkpoint_dir",),
    )  # fmt: skip
    save_interval: int = flag(
        0, "Save every N steps (0: only at the end).", "checkpoints", lower=0, aliases=("checkpoint_every",)
    )
    max_checkpoint_keep: int = flag(
        2, "Checkpoints kept in --save (older ones are deleted).", "checkpoints", lower=1, aliases=("keep_checkpoints",)
    )
    save_optimizer_state: bool = flag(
        True, "Store the optimizer's state in checkpoints (needed to resume exactly).", "checkpoints"
    )
    load_optimizer_state: bool = flag(True, "Restore the optimizer's state from the checkpoint.", "checkpoints")
    load: str = flag(
        "", "Continue from this checkpoint file or directory (newest intact); may extend the run.", "checkpoints"
    )
    resume: bool = flag(
        False, "Continue exactly from the newest intact checkpoint in --save (same settings).", "checkpoints"
    )
    fresh: bool = flag(
        False, "Start over in --save although it holds another run's files (moved into <--save>/earlier-run-<time>/).",
        "checkpoints",
    )  # fmt: skip
    allow_other_data: bool = flag(
        False, "Let --resume/--load continue on training data other than the checkpoint's.", "checkpoints"
    )
    allow_nonfinite: bool = flag(
        False, "Keep training (and saving) after a NaN or infinite loss or norm.", "checkpoints"
    )
    # ---- outputs ----
    metrics_file: str = flag(
        "", f"JSON-lines metrics (default: <--save>/{METRICS_NAME}, else under ./runs).", "outputs"
    )
    tensorboard_dir: str = flag("", "Also write TensorBoard event files here.", "outputs")
    log_file: str = flag("", "Also append step lines to this file.", "outputs")
    precision_check: str = flag(
        "", "Record per-module/op statistics: steps=A[:B],level=1|2,output_path=P,...", "outputs"
    )
    profile_steps: str = flag("", "Profile steps A..B (A:B, 1-based): op table and Chrome trace.", "outputs")
    profile_name: str = flag("profile", "Prefix of the profiler's files in the run directory.", "outputs")
    # ---- parallel ----
    zero_stage: int = flag(
        0, "ZeRO stage under infinitrain.run: 0 none, 1 optimizer state sharded, 2 gradients too, 3 parameters "
        "too (gathered per block, which is recomputed in backward).", "parallel",
        lower=0, upper=3,
    )  # fmt: skip
    tensor_parallel: int = flag(
        1, "Tensor parallel size under infinitrain.run (GPT-2, LLaMA 3, Mixtral: heads, MLP/experts).", "parallel",
        lower=1,
    )  # fmt: skip
    sequence_parallel: bool = flag(
        False, "Shard norms and the residual stream along the sequence (needs TP > 1).", "parallel"
    )
    pipeline_parallel: int = flag(
        1, "Pipeline stages under infinitrain.run (layers split by parameters).", "parallel", lower=1
    )
    virtual_pipeline_parallel: int = flag(
        1, "Model chunks per pipeline stage (> 1: the interleaved 1F1B schedule).", "parallel", lower=1
    )
    pipeline_schedule: str = flag(
        "1f1b", "Pipeline schedule (1f1b: interleaved with vPP > 1).", "parallel", choices=("1f1b", "gpipe")
    )
    pipeline_split: str = flag(
        "", "Layers per pipeline chunk, comma-separated in virtual-stage order (default: balanced).", "parallel"
    )
    # Flags given explicitly (the CLI's; from Python, the fields that differ from their defaults).
    present: frozenset = field(default=None, compare=False, repr=False, metadata={"internal": True})

    def __post_init__(self):
        if self.present is None:
            given = {f.name for f in flag_fields() if getattr(self, f.name) != f.default}
            object.__setattr__(self, "present", frozenset(given))
        self._check_values()
        self._check_conflicts()

    # ---- construction ----
    @classmethod
    def from_flags(cls, fv):
        """From parsed absl flags (define_flags' flags): their values, and which were given."""
        values = {f.name: fv[f.name].value for f in flag_fields()}
        present = frozenset(f.name for f in flag_fields() if fv[f.name].present)
        return cls(**values, present=present)

    def replace(self, **changes):
        """A copy with `changes`, which count as given (as flags on the command line would)."""
        return dataclasses.replace(self, **changes, present=self.present | frozenset(changes))

    def values(self):
        """{flag name: value} of every flag (what the metrics' config record and checkpoints store)."""
        return {f.name: getattr(self, f.name) for f in flag_fields()}

    # ---- checks ----
    def _check_values(self):
        for f in flag_fields():
            v, meta = getattr(self, f.name), f.metadata
            if v is None:
                continue
            if meta["choices"] and v not in meta["choices"]:
                raise UsageError(f"--{f.name}={v}: expected one of {', '.join(meta['choices'])}")
            if meta["lower"] is not None and v < meta["lower"]:
                raise UsageError(f"--{f.name}={v} must be >= {meta['lower']}")
            if meta["upper"] is not None and v > meta["upper"]:
                raise UsageError(f"--{f.name}={v} must be <= {meta['upper']}")
            if meta["neutral"] is not None and v not in meta["neutral"]:
                raise UsageError(f"--{f.name}={v}: {meta['missing']} is not implemented yet")
        for name in (
            "learning_rate", "weight_decay", "grad_clip", "lr_warmup_init", "min_lr", "lora_alpha",
            "router_aux_loss_coef",
        ):  # fmt: skip
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise UsageError(f"--{name}={v} must be finite and >= 0")
        if not 0.0 <= self.lora_dropout < 1.0:  # NaN fails too
            raise UsageError(f"--lora_dropout={self.lora_dropout} must be in [0, 1)")

    def _check_conflicts(self):
        if self.activation_recompute and self.recompute_granularity == "none":
            raise UsageError(
                "--recompute_granularity=none means no recompute, but --activation_recompute asks for it: pass "
                "--recompute_granularity=full (every block) or drop --activation_recompute"
            )
        if self.recompute_num_layers > 1:
            raise UsageError(
                f"--recompute_num_layers={self.recompute_num_layers}: recompute regions of several layers are not "
                "implemented yet (--activation_recompute recomputes each block)"
            )
        if self.resume and not self.save:
            raise UsageError("--resume needs --checkpoint_dir (or --save)")
        if self.resume and self.load:
            raise UsageError("--resume and --load: pick one (--resume continues --save exactly; --load may extend)")
        if self.fresh and not self.save:
            raise UsageError("--fresh needs --checkpoint_dir (or --save): it starts over in that directory")
        if self.fresh and self.resume:
            raise UsageError(
                "--fresh and --resume: pick one (--resume continues the run in --save; --fresh sets its files aside "
                "and starts over)"
            )
        if self.nthread_per_process > 1 and self.devices:
            raise UsageError("--nthread_per_process and --devices both choose devices; pick one")
        if self.fp8:
            other = [
                f"--{n}" for n, on in (
                    ("lora_rank", self.lora_rank), ("lora_load_path", self.lora_load_path),
                    ("tensor_parallel", self.tensor_parallel > 1), ("pipeline_parallel", self.pipeline_parallel > 1),
                    ("zero_stage=3", self.zero_stage == 3), ("precision_check", self.precision_check),
                    ("activation_recompute", self.activation_recompute),
                ) if on
            ]  # fmt: skip
            if other:
                raise UsageError(
                    f"--fp8 with {', '.join(other)} is not implemented yet (FP8 covers one device, DDP "
                    "and ZeRO-1/2, full training without recompute)"
                )

    # ---- derived settings ----
    @property
    def resolved_min_lr(self):
        return self.learning_rate / 10 if self.min_lr is None else self.min_lr

    @property
    def decay_iters(self):
        return self.lr_decay_iters or self.num_iteration

    @property
    def autocast(self):
        return self.dtype == "bfloat16"


def flag_fields():
    """RunConfig's fields that are flags, in definition order."""
    return [f for f in dataclasses.fields(RunConfig) if not f.metadata.get("internal")]


def defaults():
    return {f.name: f.default for f in flag_fields()}


def define_flags(fv):
    """Declares RunConfig's fields as absl flags (with their aliases) on FlagValues fv."""
    from absl import flags

    for f in flag_fields():
        meta, kind = f.metadata, _kind(f)
        common = {"flag_values": fv}
        if meta["choices"]:
            flags.DEFINE_enum(f.name, f.default, list(meta["choices"]), meta["help"], **common)
        elif kind is bool:
            flags.DEFINE_bool(f.name, f.default, meta["help"], **common)
        elif kind is int:
            flags.DEFINE_integer(
                f.name, f.default, meta["help"], lower_bound=meta["lower"], upper_bound=meta["upper"], **common
            )
        elif kind is float:
            flags.DEFINE_float(f.name, f.default, meta["help"], lower_bound=meta["lower"], **common)
        else:
            flags.DEFINE_string(f.name, f.default, meta["help"], **common)
        for alias in meta["aliases"]:
            flags.DEFINE_alias(alias, f.name, flag_values=fv)


def aliases():
    """{alias: flag name}: our earlier names."""
    return {a: f.name for f in flag_fields() for a in f.metadata["aliases"]}


def _kind(f):
    t = f.type if isinstance(f.type, type) else None
    if t is None:  # "int | None" and friends
        text = str(f.type)
        for k in (bool, int, float, str):
            if k.__name__ in text:
                return k
    return t


def show_default(f):
    """A field's default as a flag would be written (--help, docs/train_flags.md)."""
    v = f.default
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v) if v == "" else str(v)

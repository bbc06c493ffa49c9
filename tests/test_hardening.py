"""Inputs that used to crash the process or fail with an unclear message: each case runs where a crash
cannot take the test run down (a child process) when it once aborted, and must end in one clear exception."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config


def run_child(code, timeout=240, cap=False):
    """Runs `code` in a fresh interpreter that sees this one's packages; returns the CompletedProcess.
    cap: define cap_memory(extra_mib) first (see LIMIT_AS)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="2")
    env.pop("BUILD_WORKING_DIRECTORY", None)
    prelude = f"import infinitrain as it\nimport infinitrain.functional as F\nDEVICE = {DEVICE!r}\n"
    prelude += LIMIT_AS if cap else ""
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_no_signal(p):
    assert p.returncode >= 0, f"killed by {signal.Signals(-p.returncode).name}: {p.stderr[-2000:]}"
    assert p.returncode == 0, p.stdout + p.stderr


# A child that caps its address space above what it has mapped so far, so one big allocation fails. OpenBLAS
# allocates a buffer per thread on first use and retries forever when that fails: warm every thread up first.
LIMIT_AS = """
import resource
def cap_memory(extra_mib, warm=True):
    for heads in (1, 2) if warm else ():
        w = it.randn(1, heads, 2000, 8, requires_grad=True)
        F.scaled_dot_product_attention(w, w, w).sum().backward()
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra_mib * 2**20, resource.RLIM_INFINITY))
"""


def test_sdpa_forward_too_long_for_memory_raises_memory_error_not_sigabrt():
    """SIGABRT case: sdpa's T x S scratch was allocated inside an OpenMP region, so std::bad_alloc aborted."""
    p = run_child(
        """
        q = it.randn(1, 2, 100000, 8, device=DEVICE)
        try:
            F.scaled_dot_product_attention(q, q, q).numpy()
            print("computed")
        except MemoryError as e:
            print("MemoryError:", e)
        """
    )
    assert_no_signal(p)
    if "computed" not in p.stdout:
        assert "MemoryError: sdpa: out of memory" in p.stdout and "[100000, 100000]" in p.stdout, p.stdout


@pytest.mark.skipif(DEVICE != "cpu", reason="caps the address space of a CPU process")
def test_sdpa_backward_out_of_memory_raises_memory_error_not_sigabrt():
    """SIGABRT case, backward: the forward fits in the capped address space, the backward's scratch does not."""
    p = run_child(
        """
        q = it.randn(1, 2, 6000, 8, requires_grad=True)
        cap_memory(250)  # the forward needs 144 MB of scores on one thread, the backward 288 MB
        out = F.scaled_dot_product_attention(q, q, q)
        print("forward ok")
        try:
            out.sum().backward()
            print("computed")
        except MemoryError as e:
            print("MemoryError:", e)
        """,
        cap=True,
    )
    assert_no_signal(p)
    assert "forward ok" in p.stdout, p.stdout + p.stderr
    assert "MemoryError: sdpa_backward: out of memory" in p.stdout, p.stdout + p.stderr


@pytest.mark.skipif(DEVICE != "cpu", reason="caps the address space of a CPU process")
def test_exception_inside_parallel_for_reaches_python_not_sigabrt():
    """SIGABRT case: any C++ exception inside ParallelFor's OpenMP region (here scatter_add's per-task buffer
    failing to allocate) is carried out of the region and raised as MemoryError naming the op."""
    p = run_child(
        """
        import numpy as np
        n = 1 << 22
        x = it.zeros(4, n, 1)
        index = it.from_numpy(np.zeros((4, 1, 1), np.int64))
        src = it.ones(4, 1, 1)
        cap_memory(80, warm=False)  # room for the 64 MiB output; each thread's 32 MiB buffer then fails
        try:
            F.scatter_add(x, 1, index, src)
            print("computed")
        except MemoryError as e:
            print("MemoryError:", e)
        """,
        cap=True,
    )
    assert_no_signal(p)
    if "computed" not in p.stdout:
        assert "MemoryError: scatter_add: out of memory" in p.stdout, p.stdout


def test_out_of_memory_names_what_was_allocated():
    with pytest.raises(MemoryError, match=r"empty: out of memory allocating float32\[1099511627776, 1024\]"):
        it.empty(2**40, 2**10, device=DEVICE)
    a = it.zeros(1, 2**21, device=DEVICE)
    with pytest.raises(MemoryError, match=r"matmul: out of memory with outputs float32\[2097152, 2097152\]"):
        it.functional.matmul(a.transpose(0, 1), a).numpy()


def test_unclear_messages_are_clear():
    x = it.randn(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="'float128' is neither a dtype"):
        x.to("float128")
    with pytest.raises(IndexError, match=r"transpose: dim 5 out of range for a 2-d tensor"):
        x.transpose(0, 5)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\)"):
        it.manual_seed(2**64)
    it.randn(2)  # the bad seed was not kept
    with pytest.raises(ValueError, match="seed"):
        it.Generator(-1)


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
def test_model_input_shape_and_id_range(kind):
    """A 1-d input said "not enough values to unpack"; GPT-2 accepted ids in [vocab, padded_vocab)."""
    if kind == "gpt2":
        m = GPT2(GPT2Config(block_size=8, vocab_size=50, padded_vocab_size=64, n_layer=1, n_head=2, n_embd=16), DEVICE)
    else:
        m = LLaMA3(LLaMA3Config(8, 50, 1, 2, 1, 16, ffn_dim_multiplier=1.0, multiple_of=16), DEVICE)
    with pytest.raises(ValueError, match=r"idx must be a 2-d \[batch, sequence\] tensor"):
        m(it.tensor([1, 2, 3], dtype="int64", device=DEVICE))
    with pytest.raises(IndexError, match="index 55 out of range"):
        m(it.from_numpy(np.array([[1, 55]]), device=DEVICE))[0].numpy()
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\)"):
        m.generate(np.array([[1, 55]]), 2)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"learning_rate": float("nan")}, "learning rate"),
        ({"learning_rate": float("inf")}, "learning rate"),
        ({"weight_decay": float("nan")}, "weight_decay"),
        ({"eps": float("nan")}, "eps"),
        ({"eps": 0.0}, "eps"),
        ({"betas": (float("nan"), 0.9)}, "betas"),
        ({"betas": (0.9, float("inf"))}, "betas"),
    ],
)
def test_adamw_refuses_non_finite_hyperparameters(kwargs, message):
    """Silent NaN training: AdamW(lr=nan) and friends were accepted."""
    p = [it.nn.Parameter(it.zeros(3, device=DEVICE))]
    lr = kwargs.pop("learning_rate", 1e-3)
    with pytest.raises(ValueError, match=message):
        it.optim.AdamW(p, lr=lr, **kwargs)


def test_optimizers_refuse_non_finite_hyperparameters_later_too():
    p = [it.nn.Parameter(it.zeros(3, device=DEVICE))]
    for bad in ({"lr": float("nan")}, {"momentum": float("nan")}, {"weight_decay": float("inf")}, {"momentum": -1}):
        with pytest.raises(ValueError):
            it.optim.SGD(p, **bad)
    opt = it.optim.AdamW(p)
    with pytest.raises(ValueError, match="learning rate"):
        opt.lr = float("nan")  # the train loop sets lr every step
    with pytest.raises(ValueError, match="max_norm"):
        it.optim.clip_grad_norm_(p, float("nan"))

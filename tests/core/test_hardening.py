"""Inputs that used to crash the process or fail with an unclear message: each case runs where a crash
cannot take the test run down (a child process) when it once aborted, and must end in one clear exception."""

import os
import re
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
        # On sim the kernel's error arrives from the stream worker, led by "sdpa on sim:<i>: ".
        assert re.search(r"MemoryError: (sdpa on \w+:\d+: )?sdpa: out of memory", p.stdout), p.stdout
        assert "[100000, 100000]" in p.stdout, p.stdout


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
    """MemoryError said only "std::bad_alloc": now the op (when an op allocates) and the bytes."""
    with pytest.raises(it.runtime.OutOfMemoryError, match="out of memory allocating 4503599627370496 bytes"):
        it.empty(2**40, 2**10, device=DEVICE)
    a = it.zeros(1, 2**21, device=DEVICE)
    with pytest.raises(MemoryError, match=r"^matmul: .*out of memory allocating 17592186044416 bytes"):
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
        it.Generator().manual_seed(-1)


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


# ---- model files -------------------------------------------------------------------------------------------


def tiny_llama(**kw):
    cfg = dict(ffn_dim_multiplier=1.0, multiple_of=16, norm_eps=2.0**-17, rope_theta=1e4)
    cfg.update(kw)
    return LLaMA3(LLaMA3Config(16, 61, 2, 4, 2, 32, **cfg), DEVICE)


def write_llama_header(path, ints, floats=None, n_params=None):
    """A LLaMA 3 model file from raw header words: 256 int32 words, then (llm.c layout) 256 float32 words."""
    header = np.zeros(256, "<i4")
    header[: len(ints)] = ints
    parts = [header.tobytes()]
    if floats is not None:
        f = np.zeros(256, "<f4")
        f[: len(floats)] = floats
        parts.append(f.tobytes())
    parts.append(np.zeros(n_params or 0, "<f4").tobytes())
    path.write_bytes(b"".join(parts))
    return path


def test_llama3_reads_llmc_train_llama3_layout(tmp_path):
    """llm.c's train_llama3.py writes int32[256] (magic, version, block_size, vocab, n_layer, n_head, n_kv_head,
    n_embd, multiple_of, use_scaled_rope, major, minor) then float32[256] (ffn_dim_multiplier, norm_eps,
    rope_theta); both layouts are read, told apart by the header."""
    it.manual_seed(5)
    m = tiny_llama()
    ours, theirs = tmp_path / "ours.bin", tmp_path / "llmc.bin"
    m.save_llmc(ours)
    m.save_llmc(theirs, layout="llmc")
    ints = np.fromfile(theirs, "<i4", count=256)
    floats = np.fromfile(theirs, "<f4", count=256, offset=1024)
    assert list(ints[:12]) == [20240803, 3, 16, 61, 2, 4, 2, 32, 16, 1, 3, 1] and not ints[12:].any()
    assert list(floats[:3]) == [1.0, 2.0**-17, 1e4] and not floats[3:].any()
    params = np.fromfile(theirs, "<f4", offset=2048)
    np.testing.assert_array_equal(params, np.fromfile(ours, "<f4", offset=1024))
    assert (
        LLaMA3.llmc_layout(ints) == "llmc" and LLaMA3.llmc_layout(np.fromfile(ours, "<i4", count=256)) == "infinitrain"
    )
    for path in (ours, theirs):
        loaded = LLaMA3.from_llmc(path, DEVICE)
        for (n, a), (_, b) in zip(m.named_parameters(), loaded.named_parameters(), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{path.name} {n}")
        assert loaded.config.rope_theta == 1e4 and loaded.config.norm_eps == 2.0**-17
    # A file in llm.c's layout written here by hand, not by our writer: the parameter count decides nothing.
    n = m.num_parameters()
    hand = write_llama_header(
        tmp_path / "hand.bin", [20240803, 3, 16, 61, 2, 4, 2, 32, 16, 1, 3, 1], [1.0, 1e-5, 1e4], n
    )
    cfg = LLaMA3.from_llmc(hand).config
    assert (cfg.multiple_of, cfg.use_scaled_rope, cfg.version_minor) == (16, True, 1)
    assert cfg.norm_eps == pytest.approx(1e-5) and cfg.rope_theta == 1e4


GOOD_LLAMA = [20240803, 3, 16, 61, 2, 4, 2, 32, 16, 1, 3, 1]


@pytest.mark.parametrize(
    "ints,floats,field",
    [
        ({5: 0}, {}, "n_head"),
        ({6: 0}, {}, "n_kv_head"),
        ({2: 2**29}, {}, "block_size"),
        ({2: -5}, {}, "block_size"),
        ({9: 7}, {}, "use_scaled_rope"),
        ({10: -1}, {}, "version_major"),
        ({8: 0}, {}, "multiple_of"),
        ({}, {1: float("inf")}, "norm_eps"),
        ({}, {1: float("nan")}, "norm_eps"),
        ({}, {1: 0.0}, "norm_eps"),
        ({}, {2: float("inf")}, "rope_theta"),
        ({}, {2: 1e30}, "rope_theta"),
        ({}, {0: float("nan")}, "ffn_dim_multiplier"),
        ({}, {0: -1.0}, "ffn_dim_multiplier"),
        ({7: 36}, {}, "head dimension"),
    ],
)
def test_llama3_header_fields_are_validated(tmp_path, ints, floats, field):
    """OOM-kill case (block_size 2**29 sized the RoPE tables) and silent accepts: each header field is checked
    before anything is allocated, and the error names the file and the field."""
    words = list(GOOD_LLAMA)
    for i, v in ints.items():
        words[i] = v
    fl = [1.0, 1e-5, 1e4]
    for i, v in floats.items():
        fl[i] = v
    path = write_llama_header(tmp_path / "bad.bin", words, fl, 1000)
    with pytest.raises(ValueError, match=field) as e:
        LLaMA3.from_llmc(path)
    assert str(path) in str(e.value)


def test_llama3_our_layout_fields_are_validated(tmp_path):
    """The single-header layout too: max_gen_batch_size negative, version_major -1, non-finite floats."""
    m = tiny_llama()
    good = tmp_path / "good.bin"
    m.save_llmc(good)
    for word, value, field in [
        (13, -1, "max_gen_batch_size"),
        (14, -1, "version_major"),
        (8, np.float32("nan").view("<i4"), "ffn_dim_multiplier"),
        (11, np.float32("inf").view("<i4"), "rope_theta"),
        (10, np.float32(-1e-5).view("<i4"), "norm_eps"),
    ]:
        data = bytearray(good.read_bytes())
        data[word * 4 : word * 4 + 4] = np.array([value], "<i4").tobytes()
        bad = tmp_path / f"bad{word}.bin"
        bad.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=field):
            LLaMA3.from_llmc(bad)


def test_llama3_huge_block_size_within_bounds_allocates_nothing_up_front():
    """RoPE tables cover the lengths in use, not block_size (a header may set it to the maximum)."""
    m = LLaMA3(LLaMA3Config(1 << 20, 61, 1, 2, 1, 16, ffn_dim_multiplier=1.0, multiple_of=16), DEVICE)
    logits, _ = m(it.from_numpy(np.zeros((1, 5), np.int64), device=DEVICE))
    assert logits.shape == (1, 5, 61) and m._rope[0].shape[0] == 64


@pytest.mark.parametrize("word,value,field", [(5, 0, "n_head"), (5, 3, "n_head"), (6, 0, "n_embd"), (7, 10, "padded")])
def test_gpt2_header_fields_are_validated(tmp_path, word, value, field):
    """An llm.c GPT-2 file with n_head=0 raised ZeroDivisionError; n_head must divide n_embd."""
    header = np.zeros(256, "<i4")
    header[:8] = [20240326, 3, 16, 61, 1, 2, 32, 64]
    header[word] = value
    path = tmp_path / "g.bin"
    path.write_bytes(header.tobytes() + bytes(400))
    with pytest.raises(ValueError, match=field) as e:
        GPT2.from_llmc(path)
    assert str(path) in str(e.value)


# ---- checkpoints and token files ---------------------------------------------------------------------------


def crafted_checkpoint(path, entries, data=b"", meta=None):
    """A checkpoint with a valid checksum around whatever entries it is given."""
    import hashlib
    import json
    import struct

    header = json.dumps({"meta": meta or {}, "tensors": entries}).encode()
    prefix = struct.pack("<8sIIQQ", b"INFTCKPT", 1, 0, len(header), len(data))
    body = prefix + header
    body += bytes((-len(body)) % 64) + data
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"name": "w", "dtype": "<f4", "shape": [2], "offset": 4, "nbytes": 8}, "not a multiple of 64"),
        ({"name": "w", "dtype": "<f4", "shape": [2.5], "offset": 0, "nbytes": 8}, "must be integers"),
        ({"name": "w", "dtype": "<f4", "shape": [True, 2], "offset": 0, "nbytes": 8}, "must be integers"),
        ({"name": 3, "dtype": "<f4", "shape": [2], "offset": 0, "nbytes": 8}, "must be str"),
        ({"name": "w", "dtype": "<f4", "shape": [2**40, 2**40], "offset": 0, "nbytes": 0}, "does not make"),
    ],
)
def test_crafted_checkpoint_with_valid_hash_is_refused(tmp_path, entry, message):
    from infinitrain import checkpoint

    path = crafted_checkpoint(tmp_path / "c.bin", [entry], bytes(128))
    with pytest.raises(ValueError, match=message):
        checkpoint.load(path)


def crafted_checkpoint_v2(path, entries, data=b"", meta=None):
    """A format-2 (safetensors) checkpoint with a valid SHA-256 digest around whatever entries it is given, so the
    loader's structure checks, not its checksum, must refuse them."""
    import hashlib
    import json
    import struct

    md = {"format": "pt", "infinitrain.format": "2", "infinitrain.meta": json.dumps(meta or {})}
    header = {"__metadata__": md, **entries}
    canon = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    md["infinitrain.sha256"] = hashlib.sha256(canon + b"\n" + data).hexdigest()
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


def _f32(shape, begin, end):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def test_crafted_v2_checkpoint_helper_writes_what_load_accepts(tmp_path):
    """The digest is right, so the refusals below are the structure checks'; an F32 tensor right after two bytes
    (not 4-byte aligned in the file, which safetensors allows) still loads with its values."""
    from infinitrain import checkpoint

    w = np.array([1.5, -2.0], np.float32)
    entries = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "w": _f32([2], 2, 10)}
    path = crafted_checkpoint_v2(tmp_path / "c.bin", entries, bytes([7, 9]) + w.tobytes(), meta={"step": 4})
    tensors, meta = checkpoint.load(path)
    assert meta == {"step": 4}
    np.testing.assert_array_equal(tensors["a"], [7, 9])
    np.testing.assert_array_equal(tensors["w"], w)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum mismatch"):
        checkpoint.load(path)


@pytest.mark.parametrize(
    "entries,nbytes,message",
    [
        ({"w": _f32([2], 4, 12)}, 12, "starts at 4, expected 0 .gaps or overlaps"),  # a gap before the first
        ({"a": _f32([2], 0, 8), "w": _f32([2], 12, 20)}, 20, "starts at 12, expected 8"),  # a gap between
        ({"a": _f32([2], 0, 8), "w": _f32([2], 4, 12)}, 12, "starts at 4, expected 8 .gaps or overlaps"),
        ({"a": _f32([2], 0, 8), "w": _f32([2], 0, 8)}, 8, "starts at 0, expected 8"),  # the same bytes twice
        ({"w": _f32([2], 8, 16)}, 8, "starts at 8, expected 0"),  # past the data
        ({"w": _f32([2.5], 0, 10)}, 10, "must be integers"),
        ({"w": _f32([2.0], 0, 8)}, 8, "must be integers"),
        ({"w": _f32([True, 2], 0, 8)}, 8, "must be integers"),
        ({"w": _f32([2], 0.0, 8)}, 8, "must be integers"),
        ({"w": _f32([-2, -1], 0, 8)}, 8, "does not fit data_offsets"),  # negative dimensions, a positive product
        ({"w": _f32([-2], -8, 0)}, 8, "does not fit data_offsets"),
        ({"w": _f32([2], 8, 0)}, 8, "does not fit data_offsets"),  # end before begin
        ({"w": _f32([2**40, 2**40], 0, 8)}, 8, "does not fit data_offsets"),
        ({"w": _f32([3], 0, 8)}, 8, "does not fit data_offsets"),
        ({"w": _f32([1] * 33, 0, 4)}, 4, "33 dimensions"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 16]}}, 8, "bad tensor entry"),
        ({"w": {"dtype": "F32", "shape": [2]}}, 8, "bad tensor entry"),
        ({"w": [0, 8]}, 8, "bad tensor entry"),
        ({"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}}, 8, "unsupported dtype"),
        ({"w": _f32([2], 0, 8)}, 16, "8 extra"),
        ({"w": _f32([4], 0, 16)}, 8, "truncated: the tensors need 16 bytes"),
    ],
)
def test_crafted_v2_checkpoint_with_valid_digest_is_refused(tmp_path, entries, nbytes, message):
    from infinitrain import checkpoint

    path = crafted_checkpoint_v2(tmp_path / "c.bin", entries, bytes(nbytes))
    with pytest.raises(ValueError, match=message):
        checkpoint.load(path)


@pytest.mark.parametrize("meta,message", [("[1, 2]", "must be a JSON object"), ("{", "unreadable meta")])
def test_crafted_v2_checkpoint_meta_with_valid_digest_is_refused(tmp_path, meta, message):
    import hashlib
    import json
    import struct

    from infinitrain import checkpoint

    md = {"format": "pt", "infinitrain.format": "2", "infinitrain.meta": meta}
    header = {"__metadata__": md, "w": _f32([2], 0, 8)}
    canon = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    md["infinitrain.sha256"] = hashlib.sha256(canon + b"\n" + bytes(8)).hexdigest()
    body = json.dumps(header).encode()
    path = tmp_path / "c.bin"
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(8))
    with pytest.raises(ValueError, match=message):
        checkpoint.load(path)


def test_token_file_truncated_while_training_raises_not_sigbus(tmp_path):
    """SIGBUS case: token files were memory-mapped, so truncating one under a running loader killed it."""
    path = tmp_path / "tokens.bin"
    it.data.write_tokens(path, np.arange(200_000) % 1000, kind="gpt2")
    p = run_child(
        f"""
        import os
        from infinitrain.data import DataLoader
        loader = DataLoader({str(path)!r}, 4, 64, shuffle=False)
        next(loader)
        os.truncate({str(path)!r}, 4096)
        try:
            for _ in range(loader.batches_per_epoch):
                next(loader)
            print("read on")
        except ValueError as e:
            print("ValueError:", e)
        """
    )
    assert_no_signal(p)
    assert "ValueError:" in p.stdout and "changed while in use" in p.stdout, p.stdout

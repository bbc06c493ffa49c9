"""The CLIs around training: prepare (text -> llm.c token files), sample (text from a checkpoint or llm.c
model) and export (checkpoint -> llm.c model file), end to end with the train CLI."""

import subprocess
import sys

import numpy as np
import pytest

from harness import child_env, rng, run_train
from infinitrain.data import ByteTokenizer, Tokenizer, read_tokens
from infinitrain.data.tokenizer import TOKENIZER_MAGIC_GPT2
from infinitrain.models import GPT2, from_pretrained
from infinitrain.runs import read_checkpoint
from infinitrain.tools import export, prepare, sample
from infinitrain.tools.export import model_from_checkpoint
from infinitrain.tools.prepare import LongestMatchEncoder


def tool(name, *args, check=True):
    cmd = [sys.executable, "-m", f"infinitrain.{name}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=300)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def run_main(capsys, main, *args):
    """A tool's main() in this process; its stdout (it must succeed)."""
    status = main(list(args))
    out = capsys.readouterr()
    assert status == 0, out.err
    return out.out


def random_text(n):
    words = ["".join(chr(c) for c in rng().integers(97, 123, size=rng().integers(1, 8))) for _ in range(n)]
    return " ".join(words) + " é✓\n"


def test_prepare_a_folder_with_the_byte_tokenizer(tmp_path):
    texts = {"b.txt": random_text(300), "a.txt": random_text(200), "skip.md": "not read"}
    (tmp_path / "in").mkdir()
    for name, text in texts.items():
        (tmp_path / "in" / name).write_text(text)
    p = tool("tools.prepare", f"--input={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}", "--val_fraction=0.1")
    assert "2 files" in p.stdout and "--tokenizer_bin=" in p.stdout
    train, val = read_tokens(tmp_path / "out" / "in_train.bin"), read_tokens(tmp_path / "out" / "in_val.bin")
    eot = ByteTokenizer.eot
    want = np.concatenate([[eot, *texts[n].encode()] for n in ("a.txt", "b.txt")])  # sorted, each after EOT
    np.testing.assert_array_equal(np.concatenate([train, val]), want)
    assert len(val) == int(len(want) * 0.1)
    tok = Tokenizer.load(tmp_path / "out" / "byte_tokenizer.bin")
    assert tok.decode(train[1 : 1 + len(texts["a.txt"].encode())]) == texts["a.txt"]


def test_longest_match_encoding_with_an_llmc_tokenizer(tmp_path):
    """An llm.c tokenizer file (every byte plus some multi-byte pieces): text encodes to the longest pieces and
    decodes back to itself."""
    pieces = [bytes([b]) for b in range(256)] + [b"th", b"the", b"the ", b"<|endoftext|>", b"ing"]
    header = np.zeros(256, "<u4")
    header[:4] = [TOKENIZER_MAGIC_GPT2, 2, len(pieces), 259]
    path = tmp_path / "tok.bin"
    path.write_bytes(header.tobytes() + b"".join(bytes([len(p)]) + p for p in pieces))
    enc = LongestMatchEncoder(Tokenizer.load(path))
    ids = enc.encode("the thing then")
    assert [pieces[i] for i in ids] == [b"the ", b"th", b"ing", b" ", b"the", b"n"]
    text = random_text(50)
    assert Tokenizer.load(path).decode(enc.encode(text)) == text
    (tmp_path / "t.txt").write_text(text)
    tool("tools.prepare", f"--input={tmp_path / 't.txt'}", f"--output_dir={tmp_path}", f"--tokenizer={path}")
    tokens = read_tokens(tmp_path / "t_train.bin")
    assert (
        tokens[0] == 259
        and Tokenizer.load(path).decode(np.concatenate([tokens, read_tokens(tmp_path / "t_val.bin")])[1:]) == text
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small GPT-2 trained for 2 steps on prepared byte-level text, saved as a checkpoint."""
    d = tmp_path_factory.mktemp("trained")
    (d / "text.txt").write_text(random_text(2000))
    tool("tools.prepare", f"--input={d / 'text.txt'}", f"--output_dir={d}")
    flags = [f"--input_bin={d / 'text_train.bin'}", f"--tokenizer_bin={d / 'byte_tokenizer.bin'}", "--num_iteration=2"]
    flags += ["--model=gpt2", "--n_layer=1", "--n_embd=32", "--n_head=2", "--sequence_length=16", "--batch_size=4"]
    run_train(*flags, f"--save={d / 'run'}", "--freq_generate_txt=0")
    return d


def test_sample_from_a_checkpoint(trained, capsys):
    args = [f"--checkpoint={trained / 'run'}", "--prompt=ab c", "--length=12", "--top_k=5", "--seed=3"]
    out = tool("tools.sample", *args).stdout  # the CLI once; then in this process
    assert out == run_main(capsys, sample.main, *args)  # seeded
    model, _ = model_from_checkpoint(str(trained / "run"))
    ids = model.generate(np.array([list(b"ab c")]), 12, temperature=1.0, top_k=5, seed=3)
    assert out == ByteTokenizer().decode(ids[0].tolist()) + "\n"
    args = [f"--checkpoint={trained / 'run'}", "--prompt_tokens=97,98", "--temperature=0", "--length=5"]
    greedy = run_main(capsys, sample.main, *args, "--tokenizer_bin=")
    ref = model.generate(np.array([[97, 98]]), 5, temperature=0.0)
    assert greedy.strip() == ByteTokenizer().decode(ref[0].tolist())  # the checkpoint names its tokenizer


def test_export_to_llmc_and_sample_from_it(trained, tmp_path, capsys):
    out = tmp_path / "model.bin"
    run_main(capsys, export.main, f"--checkpoint={trained / 'run'}", f"--output={out}")
    tensors, _ = read_checkpoint(sorted((trained / "run").glob("ckpt_*.bin"))[-1])
    exported = GPT2.from_llmc(str(out))
    for name, p in exported.state_dict().items():
        np.testing.assert_array_equal(p.numpy(), tensors[f"model.{name}"], err_msg=name)
    args = ["--prompt_tokens=10,20", "--length=6", "--seed=1", "--top_k=3"]
    a = run_main(capsys, sample.main, f"--llmc_filepath={out}", *args)  # no tokenizer: token ids
    assert a.split() == [str(t) for t in exported.generate(np.array([[10, 20]]), 6, top_k=3, seed=1)[0]]
    # A Hugging Face folder (the models' save_pretrained) holds the same weights; sample reads it too.
    hf_dir = tmp_path / "hf"
    run_main(capsys, export.main, f"--checkpoint={trained / 'run'}", f"--output={hf_dir}", "--format=safetensors")
    from_hf = from_pretrained(str(hf_dir))
    for name, p in from_hf.state_dict().items():  # GPT-2's padded embedding rows stay behind
        np.testing.assert_array_equal(p.numpy(), tensors[f"model.{name}"][: p.shape[0]], err_msg=name)
    assert run_main(capsys, sample.main, f"--init_from={hf_dir}", *args) == a


def test_bad_input_is_one_line(tmp_path, capsys):
    for main, args, needle in (
        (prepare.main, [f"--input={tmp_path / 'none'}", f"--output_dir={tmp_path}"], "no such file or folder"),
        (prepare.main, [f"--input={tmp_path}", f"--output_dir={tmp_path}"], "no *.txt files"),
        (prepare.main, [f"--input={tmp_path}"], "--output_dir"),
        (sample.main, [f"--checkpoint={tmp_path}"], "no checkpoint"),
        (sample.main, [f"--llmc_filepath={tmp_path / 'x'}"], "x"),
        (export.main, [f"--checkpoint={tmp_path / 'c.bin'}", "--output=o"], "no such checkpoint"),
    ):
        try:
            status = main(args)
        except SystemExit as e:  # argparse's usage errors
            status = e.code
        err = capsys.readouterr().err
        assert status == 2 and err.startswith("error: ") and needle in err, (args, err)
        assert len(err.splitlines()) == 1

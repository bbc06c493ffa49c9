"""Hugging Face tokenizers (tokenizer.json through the `tokenizers` package): a byte-level BPE trained on the
Shakespeare corpus in seconds, encode/decode round trips, tokenized text files in llm.c token files, the
tokenize CLI, prepare and train with a tokenizer.json end to end, and clear errors."""

import os
import pwd
import re
import subprocess
import sys

import numpy as np
import pytest

from harness import DEVICE, rng
from infinitrain.data import hf_tokenizer, read_tokens, read_tokens_header
from infinitrain.data.hf_tokenizer import HFTokenizer, train_bpe
from infinitrain.data.shakespeare import _valid, corpus_paths


# Used when the Shakespeare corpus is not cached on this machine (the tests do not download it): seeded
# pseudo-words around common English ones, varied enough that the BPE learns every merge it is asked for.
def _fallback_docs():
    gen = np.random.default_rng(7)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    common = ["the", "and", "thou", "shall", "what", "friend", "lantern", "river"]

    def word():
        if gen.random() < 0.3:
            return common[gen.integers(len(common))]
        return "".join(gen.choice(syllables, gen.integers(1, 4)))

    return [" ".join(word() for _ in range(400)) + ".\n" for _ in range(12)]


def corpus_docs():
    """Documents of the cached Shakespeare corpus (INFINITRAIN_CACHE or the user's ~/.cache/infinitrain)."""
    cache = os.environ.get("INFINITRAIN_CACHE") or os.path.join(
        pwd.getpwuid(os.getuid()).pw_dir, ".cache", "infinitrain"
    )
    train, _ = corpus_paths(cache)
    if not _valid(train):
        return _fallback_docs()
    return hf_tokenizer.corpus_documents(train)[:12]


@pytest.fixture(scope="module")
def tok():
    return train_bpe(corpus_docs(), vocab_size=400)


def test_bpe_trains_and_round_trips(tok):
    assert tok.vocab_size == 400 and tok.eot == 0 and tok.token_kind() == "gpt2"
    text = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name; é, 日本, 🙂"
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ((ids >= 0) & (ids < 400)).all()
    assert tok.decode(ids) == text  # byte-level: any UTF-8 text survives
    common = tok.encode(" the the the and and")
    assert len(common) < len(" the the the and and")  # merges learned


def test_tokenizer_json_saves_and_loads(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    again = HFTokenizer.load(path)
    text = "Shall I compare thee to a summer's day?"
    np.testing.assert_array_equal(again.encode(text), tok.encode(text))
    assert again.vocab_size == tok.vocab_size and again.eot == tok.eot


def test_text_files_become_llmc_token_files(tok, tmp_path):
    docs = ["To be, or not to be: that is the question.", "All the world's a stage."]
    paths = []
    for i, d in enumerate(docs):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_text(d, encoding="utf-8")
    n = hf_tokenizer.tokenize_files(tok, paths, tmp_path / "train.bin")
    want = np.concatenate([tok.encode(docs[0]), [tok.eot], tok.encode(docs[1])])
    assert n == want.size
    kind, _, count = read_tokens_header(tmp_path / "train.bin")
    assert (kind, count) == ("gpt2", want.size)
    np.testing.assert_array_equal(read_tokens(tmp_path / "train.bin"), want)
    assert tok.decode(read_tokens(tmp_path / "train.bin")) == docs[0] + "<|endoftext|>" + docs[1]
    # The CLI does the same, and can force 32-bit tokens.
    tok.save(tmp_path / "tokenizer.json")
    argv = [f"--tokenizer={tmp_path / 'tokenizer.json'}", f"--out={tmp_path / 'cli.bin'}", "--kind=llama3"]
    assert hf_tokenizer.main(argv + [str(p) for p in paths]) == 0
    assert read_tokens_header(tmp_path / "cli.bin")[0] == "llama3"
    np.testing.assert_array_equal(read_tokens(tmp_path / "cli.bin"), want)


def test_decodes_samples(tok):
    ids = rng().integers(1, tok.vocab_size, 30)
    assert isinstance(tok.decode(ids), str)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 400\)"):
        tok.decode([5, 400])


def test_errors(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": 3}')
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        HFTokenizer.load(bad)
    with pytest.raises(FileNotFoundError):
        HFTokenizer.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        train_bpe(["abc"], vocab_size=100)
    no_eot = train_bpe(["abc abc"], vocab_size=300, special_tokens=())
    with pytest.raises(ValueError, match="no end-of-text token"):
        hf_tokenizer.encode_documents(no_eot, ["a", "b"])


def _cli(module, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("BUILD_WORKING_DIRECTORY", None)
    env["PYTHONIOENCODING"] = "utf-8"
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, env=env, timeout=300)
    out, err = (b.decode("utf-8") for b in (p.stdout, p.stderr))  # no newline translation: samples may hold \r
    assert p.returncode == 0, out + err
    return out


def test_prepare_and_train_with_a_tokenizer_json(tok, tmp_path):
    """prepare --tokenizer=tokenizer.json writes the tokenizer's ids (each document after its end-of-text
    token); train --tokenizer_bin=tokenizer.json takes the tokenizer's vocabulary and decodes its samples
    with it (the same text as the model's seeded draw decoded here)."""
    from infinitrain.runs import read_checkpoint, read_metrics
    from infinitrain.tools.export import model_from_checkpoint

    path = tmp_path / "tokenizer.json"
    tok.save(path)
    docs = _fallback_docs()[:3]
    (tmp_path / "in").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "in" / f"{i}.txt").write_text(d, encoding="utf-8")
    out = _cli("infinitrain.tools.prepare", f"--input={tmp_path / 'in'}", f"--output_dir={tmp_path / 'data'}",
               f"--tokenizer={path}", "--val_fraction=0.2")  # fmt: skip
    assert f"--tokenizer_bin={path}" in out
    train, val = (tmp_path / "data" / f"in_{s}.bin" for s in ("train", "val"))
    want = np.concatenate([np.concatenate([[tok.eot], tok.encode(d)]) for d in docs])
    assert read_tokens_header(train)[0] == "gpt2"
    np.testing.assert_array_equal(np.concatenate([read_tokens(train), read_tokens(val)]), want)

    run = tmp_path / "run"
    flags = [f"--input_bin={train}", f"--input_val_bin={val}", f"--tokenizer_bin={path}", "--model=gpt2"]
    flags += ["--n_layer=1", "--n_head=2", "--n_embd=32", "--sequence_length=16", "--batch_size=4"]
    flags += ["--num_iteration=1", "--freq_generate_txt=1", "--text_length=8", f"--save={run}", "--seed=9"]
    out = _cli("infinitrain.train", f"--device={DEVICE}", *flags)
    config = read_metrics(run / "metrics.jsonl")[0]
    assert config["model_config"]["vocab_size"] == tok.vocab_size == 400 and config["tokenizer"] == str(path)
    assert read_checkpoint(run / "ckpt_00000001.bin")[1]["tokenizer"] == str(path)
    m = re.search(r"--- sample at step 1 ---\n(.*)\n---", out, re.S)
    assert m, out
    model, _ = model_from_checkpoint(str(run), DEVICE)
    ids = model.generate(np.full((1, 1), tok.eot), 8, temperature=1.0, top_k=40, seed=9)
    assert m.group(1) == tok.decode(ids[0, 1:].tolist())

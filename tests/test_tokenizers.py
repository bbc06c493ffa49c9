"""Hugging Face tokenizers (tokenizer.json through the `tokenizers` package): a byte-level BPE trained on the
Shakespeare corpus in seconds, encode/decode round trips, tokenized text files in llm.c token files, the
tokenize CLI, and clear errors."""

import os
import pwd

import numpy as np
import pytest

from harness import rng
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

"""Token data: llm.c token and tokenizer files, the default Shakespeare corpus, and a resumable loader.

Pure NumPy; importable without the C++ extension.
"""

from .hf_tokenizer import HFTokenizer, tokenize_files, train_bpe
from .inputs import check_input
from .loader import DataLoader
from .shakespeare import default_cache_dir, default_corpus, default_corpus_path
from .tokenizer import ByteTokenizer, Tokenizer
from .tokens import MAGIC_GPT2, MAGIC_LLAMA3, TokenFile, read_tokens, read_tokens_header, write_tokens

__all__ = [
    "ByteTokenizer",
    "DataLoader",
    "HFTokenizer",
    "MAGIC_GPT2",
    "MAGIC_LLAMA3",
    "TokenFile",
    "Tokenizer",
    "check_input",
    "default_cache_dir",
    "default_corpus",
    "default_corpus_path",
    "read_tokens",
    "read_tokens_header",
    "tokenize_files",
    "train_bpe",
    "write_tokens",
]

"""Character-level data for the nanoGPT example, as nanoGPT's shakespeare_char/prepare.py makes it: the text's
characters become ids (0 .. vocab - 1), the first 90% go to train.bin and the rest to val.bin as raw uint16, and
meta.pkl keeps the vocabulary. Plain Python and NumPy.

    python examples/nanogpt/prepare.py input.txt data/     # any text file
"""

import os
import pickle
import sys

import numpy as np


def main(text_path, out_dir):
    with open(text_path, encoding="utf-8") as f:
        data = f.read()
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = dict(enumerate(chars))
    ids = np.array([stoi[c] for c in data], dtype=np.uint16)
    n = int(0.9 * len(ids))
    os.makedirs(out_dir, exist_ok=True)
    ids[:n].tofile(os.path.join(out_dir, "train.bin"))
    ids[n:].tofile(os.path.join(out_dir, "val.bin"))
    with open(os.path.join(out_dir, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    print(f"{len(data):,} characters, vocabulary {len(chars)}: {n:,} train and {len(ids) - n:,} val tokens")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

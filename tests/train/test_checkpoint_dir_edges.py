"""CheckpointDir.set_aside called several times within one second (the directory name has a one-second clock):
each call gets a directory of its own and moves exactly its entries."""

import os

from infinitrain.runs import CheckpointDir


def test_set_aside_twice_in_one_second(tmp_path):
    """Repeated set_aside calls (same timestamp) make distinct earlier-run directories, none overwritten."""
    cd = CheckpointDir(str(tmp_path / "ckpt"))
    try:
        targets = []
        for i in range(4):
            name = f"ckpt_{i:08d}.bin"
            with open(os.path.join(cd.directory, name), "w") as f:
                f.write(str(i))
            targets.append(cd.set_aside([name]))
        assert len(set(targets)) == 4
        for i, t in enumerate(targets):
            assert os.listdir(t) == [f"ckpt_{i:08d}.bin"]
    finally:
        cd.close()

"""The README's Python example runs as written (on the CPU) and its loss falls."""

import os
import re
import subprocess
import sys

from harness import repo_file


def _readme():
    with open(repo_file("README.md")) as f:
        return f.read()


def test_readme_python_example_runs_as_written(tmp_path):
    text = _readme()
    section = text[text.index("## Using it from Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    losses = [float(line.split()[1]) for line in p.stdout.strip().splitlines()]
    assert len(losses) == 10 and losses[-1] < losses[0] - 0.5, losses  # uniform over 257 ids: 5.55

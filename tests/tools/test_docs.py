"""Every code block in the README and docs/ either runs as written or says it is a fragment: each fenced block
names its language; a `python` block runs from the repository root and from a folder outside it; a `sh` block's
`./bazelw` commands are the ones .ci/run runs, and its other lines run in bash; `python fragment` and
`sh fragment` blocks (a part of a program, or a command that needs data, a GPU or a network) are not run."""

import os
import re
import subprocess
import sys

import pytest

from harness import repo_file

DOCS = ["README.md"] + [
    f"docs/{name}.md"
    for name in ("architecture", "benchmarks", "build", "decisions", "providers", "python", "testing", "train_flags",
                 "training")
]  # fmt: skip
FENCE = re.compile(r"^```(.*)$")


def blocks(path):
    """[(first line number, info string, code)] of the fenced blocks of a Markdown file."""
    out, open_at, info, body = [], None, "", []
    with open(repo_file(path)) as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if m and open_at is None:
                open_at, info, body = n, m.group(1).strip(), []
            elif m and not m.group(1).strip():
                out.append((open_at, info, "".join(body)))
                open_at = None
            elif open_at is not None:
                body.append(line)
    assert open_at is None, f"{path}:{open_at}: a fenced block is never closed"
    return out


ALL = [(path, *b) for path in DOCS for b in blocks(path)]


def _runnable(kind):
    return [pytest.param(p, n, code, id=f"{p}:{n}") for p, n, info, code in ALL if info.split() == [kind]]


def test_every_block_names_its_language():
    unnamed = [f"{p}:{n}" for p, n, info, _ in ALL if not info]
    assert not unnamed, f"fenced blocks without a language (text, python, sh, cpp, ...): {unnamed}"
    assert len(_runnable("python")) >= 3  # the README's, the docs' training loop and PyTorch-style examples


def _env(tmp_path):
    path = os.pathsep.join(p for p in sys.path if p)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(sys.executable)
    env = dict(os.environ, PYTHONPATH=path, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("BUILD_WORKING_DIRECTORY", None)
    return env


def _root():
    return os.path.dirname(os.path.abspath(repo_file("README.md")))


@pytest.mark.parametrize("path,line,code", _runnable("python"))
def test_python_block_runs_as_written(path, line, code, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for cwd in (_root(), outside):
        p = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_env(tmp_path), capture_output=True, text=True,
                           timeout=600)  # fmt: skip
        assert p.returncode == 0, f"{path}:{line} from {cwd}:\n{p.stdout[-2000:]}{p.stderr[-4000:]}"


@pytest.mark.parametrize("path,line,code", _runnable("sh"))
def test_sh_block_runs_as_written(path, line, code, tmp_path):
    with open(repo_file(".ci/run")) as f:
        ci = f.read()
    for command in code.splitlines():
        command = command.split(" #")[0].strip()
        if not command or command.startswith("#"):
            continue
        if command.startswith("./bazelw"):
            # Bazel does not run inside a Bazel test: .ci/run runs these, as written.
            assert command in ci, f"{path}:{line}: .ci/run does not run `{command}`; run it there or mark a fragment"
            continue
        p = subprocess.run(["bash", "-c", command], cwd=_root(), env=_env(tmp_path), capture_output=True, text=True,
                           timeout=600)  # fmt: skip
        assert p.returncode == 0, f"{path}:{line}: `{command}`:\n{p.stdout[-2000:]}{p.stderr[-4000:]}"


def test_readme_is_an_entry_point():
    with open(repo_file("README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 150
    assert max(len(line) for line in text.splitlines()) <= 120
    for doc in re.findall(r"`(docs/[a-z_]+\.md)`", text):
        assert os.path.isfile(repo_file(doc)), doc

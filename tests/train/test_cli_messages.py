"""Messages a new user meets on the way through the README and docs: --help succeeds and names the command, the
corpus download says what it does and, without network, suggests --input_bin, an unknown provider names the
--config to build, importing the package from a checkout without a build says what to run, and the progress bar
on a terminal fills in proportion to the steps done."""

import os
import re
import shutil
import subprocess
import sys

import infinitrain


def _run(*args, env_extra=None, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env_extra or {}))
    env.pop("BUILD_WORKSPACE_DIRECTORY", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd, stdin=subprocess.DEVNULL
    )


def test_help_exits_zero_and_names_the_command():
    p = _run("-m", "infinitrain.train", "--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    assert "./bazelw run //python:train" in out and "--num_iteration" in out
    assert "embedded" not in out and "_bazel_" not in out  # no Bazel cache path as the program name


def test_offline_corpus_download_says_so_and_suggests_input_bin(tmp_path):
    # pip pointed at a closed loopback port: the download fails at once, as offline.
    env = {
        "INFINITRAIN_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
    }
    p = _run("-m", "infinitrain.train", "--num_iteration=1", "--device=cpu", env_extra=env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "downloading the default corpus" in p.stderr
    assert "--input_bin" in p.stderr and "Traceback" not in p.stderr


def test_unknown_provider_names_the_config(tmp_path):
    p = _run("-c", "import infinitrain as it; it.zeros(2, device='nosuchprov:0')")
    assert p.returncode != 0
    assert "unknown device type 'nosuchprov'" in p.stderr and "--config=nosuchprov" in p.stderr


def test_import_without_a_build_says_what_to_run(tmp_path):
    src = os.path.dirname(infinitrain.__file__)
    shutil.copytree(src, tmp_path / "infinitrain", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {"PYTHONPATH": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-c", "import infinitrain"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env, "PYTHONNOUSERSITE": "1"},
        timeout=120,
    )
    assert p.returncode != 0
    assert "./bazelw run //python:develop" in p.stderr and "circular import" not in p.stderr, p.stderr


def test_progress_bar_eta_is_the_rate_times_the_steps_left(capsys, monkeypatch):
    """eta = seconds per step so far (since the bar started, over the steps done since its first) * steps left:
    10 s for steps 2 and 3 (from step 1) of 7 leaves 4 steps, 20 s; at the end, 0 s. The clock is stood in for."""
    from types import SimpleNamespace

    from infinitrain.training import trainer

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    now = [100.0]
    monkeypatch.setattr(trainer, "time", SimpleNamespace(time=lambda: now[0]))
    bar = trainer.Progress(7, start=1)
    now[0] = 110.0
    bar.show(2 + 1)
    assert capsys.readouterr().err.endswith(" 3/7 eta 20s")  # 10 s / 2 steps * 4 left
    bar.show(7)
    assert capsys.readouterr().err.endswith(" 7/7 eta 0s")


def test_progress_bar_fills_in_proportion(capsys, monkeypatch):
    """On a terminal the bar is 30 cells, floor(30 * done / total) of them filled, followed by done/total; off a
    terminal it writes nothing."""
    from infinitrain.training.trainer import Progress

    assert not Progress(10).on  # captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    total = 7
    bar = Progress(total)
    for done in range(total + 1):
        bar.show(done, loss=1.5)
        line = capsys.readouterr().err
        m = re.fullmatch(r"\r\[(#*)(\.*)\] (\d+)/(\d+) eta \d+s loss 1\.5000", line)
        assert m, line
        assert len(m[1]) == 30 * done // total and len(m[1]) + len(m[2]) == 30
        assert (int(m[3]), int(m[4])) == (done, total)

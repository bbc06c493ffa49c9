"""compare --precision looks for each run's precision record beside that run (its directory, or the directory of
its metrics file), not in the current directory. The generated-mutant sample (docs/mutation_python.md) found that
reading ./precision.jsonl for every run passed the suite: its one --precision test trains both runs from the
current directory, where the mutant also writes them."""

import os

import pytest

from infinitrain.tools import compare as C


@pytest.mark.parametrize("as_metrics_file", [False, True], ids=["dirs", "metrics_files"])
def test_precision_records_are_looked_for_beside_each_run(tmp_path, monkeypatch, capsys, as_metrics_file):
    runs = []
    for name in ("a", "b"):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        runs.append(str(d / "metrics.jsonl") if as_metrics_file else str(d))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("BUILD_WORKING_DIRECTORY", raising=False)
    assert C.main([*runs, "--precision", f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    want = os.path.join(str(tmp_path / "runs" / "a"), "precision.jsonl")
    assert f"error: {want}: no precision record" in err, err

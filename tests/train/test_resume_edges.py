"""How rank 0's resume outcome reaches the other ranks of a multi-process run through the rendezvous store: no
checkpoint to resume from as a fresh start, rank 0's failure as an error (not as a path to load)."""

from types import SimpleNamespace

import pytest

import infinitrain as it
from infinitrain import _C
from infinitrain.runs import TrainError
from infinitrain.training import strategy

KW = {"allow_other_data": False, "load_optimizer": True}


def _rank(r):
    return SimpleNamespace(mp=SimpleNamespace(rank=r))


def _not_led():
    raise AssertionError("only rank 0 resumes itself")


def test_rank0_resume_outcome_reaches_the_other_ranks(monkeypatch):
    """Rank 0 finding no checkpoint starts every rank at step 0; rank 0 failing stops the others with an error
    naming rank 0. The store is a real in-process TcpStore; the echo delay is dropped (it only orders exits)."""
    store = _C.TcpStore("127.0.0.1", 0, True, 10.0)
    monkeypatch.setattr(it.distributed, "default_store", lambda: store)
    monkeypatch.setattr(strategy, "_ECHO_DELAY_S", 0)
    assert strategy._resume_led_by_rank0(_rank(0), None, KW, lambda: (0, None)) == (0, None)
    assert strategy._resume_led_by_rank0(_rank(1), None, KW, _not_led) == (0, None)

    def fail():
        raise TrainError("no readable checkpoint")

    with pytest.raises(TrainError, match="no readable checkpoint"):
        strategy._resume_led_by_rank0(_rank(0), None, KW, fail)
    with pytest.raises(TrainError, match="rank 0 could not resume"):
        strategy._resume_led_by_rank0(_rank(1), None, KW, _not_led)

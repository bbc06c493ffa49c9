"""autocast's default 16-bit dtype by device: bfloat16 on the cpu, the registered provider's declared dtype on its
devices. The CPU build has no provider, so the registered provider is stood in for."""

from infinitrain import _C, amp


def test_default_dtype_is_the_registered_providers(monkeypatch):
    """A provider registers its autocast dtype (float16 here): its devices default to it, the cpu keeps bfloat16,
    and with no provider registered every device defaults to bfloat16."""
    slot = {"info": {"name": "alpha", "autocast_dtype": "float16"}}
    monkeypatch.setattr(_C, "privateuse1", lambda: slot["info"])
    monkeypatch.setattr(_C, "parse_device", lambda d: d if ":" in d or d == "cpu" else f"{d}:0")
    assert amp.default_dtype("alpha:1") == amp.default_dtype("alpha") == "float16"
    assert amp.autocast("alpha").dtype == "float16"
    assert amp.default_dtype("cpu") == amp.autocast("cpu").dtype == "bfloat16"
    assert amp.default_dtype("beta:0") == "bfloat16"  # a name other than the registered provider's
    slot["info"] = None
    assert amp.default_dtype("alpha:1") == "bfloat16"

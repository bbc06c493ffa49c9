"""Analysis-time check of the MACA SDK found by local_maca."""

load("@local_maca//:sdk.bzl", "MACA_MISSING")

def _maca_sdk_check_impl(ctx):
    if MACA_MISSING:
        fail("--config=maca: " + MACA_MISSING)
    fail("--config=maca: the MACA SDK was found, but the maca provider is not built yet (backends/maca does not exist)")

maca_sdk_check = rule(implementation = _maca_sdk_check_impl)

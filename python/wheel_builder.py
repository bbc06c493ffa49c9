"""Writes a binary wheel (PEP 427) from explicit files: --file <path in the wheel>=<path on disk>."""

import argparse
import base64
import hashlib
import os
import zipfile

_DIST = "infinitrain"
_SUMMARY = "Train language models on any accelerator that plugs in as a provider"


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--python_tag", required=True)
    ap.add_argument("--requires", action="append", default=[])
    ap.add_argument("--file", action="append", default=[])
    a = ap.parse_args()
    info = f"{_DIST}-{a.version}.dist-info"
    py = a.python_tag[2:]
    files = {}
    for spec in a.file:
        dst, src = spec.split("=", 1)
        with open(src, "rb") as f:
            files[dst] = f.read()
    files[f"{info}/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {_DIST}", f"Version: {a.version}", f"Summary: {_SUMMARY}"]
        + [f"Requires-Python: =={py[0]}.{py[1:]}.*"]
        + [
            f"Provides-Extra: {e}"
            for e in sorted({r.split("extra == '")[1][:-1] for r in a.requires if "extra ==" in r})
        ]
        + [f"Requires-Dist: {r}" for r in a.requires]
        + [""]
    ).encode()
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: infinitrain wheel_builder\nRoot-Is-Purelib: false\n"
        f"Tag: {a.python_tag}-{a.python_tag}-linux_x86_64\n"
    ).encode()
    tops = sorted({p.split("/")[0].removesuffix(".so") for p in files if not p.startswith(info)})
    files[f"{info}/top_level.txt"] = ("\n".join(tops) + "\n").encode()
    files[f"{info}/entry_points.txt"] = b"[console_scripts]\ninfinitrain-train = infinitrain.train:run\n"
    record = [f"{p},{_digest(d)},{len(d)}" for p, d in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    tmp = a.out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(files):
            zi = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible
            zi.external_attr = (0o755 if p.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, files[p])
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()

"""`./bazelw run //python:develop`: installs the package into the project's .venv in editable form.

Links the built libraries (and the provider modules of the --config in use, e.g. --config=sim) into the
source tree, and puts a .pth file plus a dist-info into .venv's site-packages, so `.venv/bin/python` imports
infinitrain from python/ (source edits take effect at once, rebuilds after running this again) and
`.venv/bin/pip show/uninstall infinitrain` know it. Provider links from an earlier config are removed.
"""

import glob
import json
import os
import subprocess
import sys

VERSION = "0.1.0"


def main(args):
    *paths, manifest = args
    with open(manifest) as f:
        paths += [line.strip() for line in f if line.strip()]  # runfiles paths of the provider modules
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    if not root:
        sys.exit("run this through `./bazelw run //python:develop` (it needs the workspace directory)")
    src = os.path.join(root, "python")
    wanted = set()
    for p in paths:
        name = os.path.basename(p)
        dst = (
            os.path.join(src, "infinitrain", name)
            if name in ("_C.so", "_gloo.so", "libinfinitrain.so")
            else os.path.join(src, name)
        )
        wanted.add(dst)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.realpath(p), dst)
        print(f"linked {dst}")
    for stale in glob.glob(os.path.join(src, "infinitrain_*.so")):
        if stale not in wanted and os.path.islink(stale):
            os.remove(stale)
            print(f"removed {stale} (a provider this build does not include)")
    venv_python = os.path.join(root, ".venv", "bin", "python3")
    site = subprocess.run(
        [venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    pth = os.path.join(site, "__editable__.infinitrain.pth")
    with open(pth, "w") as f:
        f.write(src + "\n")
    info = os.path.join(site, f"infinitrain-{VERSION}.dist-info")
    os.makedirs(info, exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: infinitrain\nVersion: {VERSION}\n",
        "INSTALLER": "infinitrain-develop\n",
        "direct_url.json": json.dumps({"url": "file://" + src, "dir_info": {"editable": True}}) + "\n",
    }
    for name, text in files.items():
        with open(os.path.join(info, name), "w") as f:
            f.write(text)
    record = [os.path.relpath(pth, site) + ",,"] + [f"infinitrain-{VERSION}.dist-info/{n},," for n in files]
    record.append(f"infinitrain-{VERSION}.dist-info/RECORD,,")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("\n".join(record) + "\n")
    providers = sorted(os.path.basename(p)[len("infinitrain_") : -3] for p in wanted if "infinitrain_" in p)
    print(f"installed infinitrain (editable: {src}) into {os.path.join(root, '.venv')}")
    print(f"providers: {', '.join(providers) or 'none (add --config=sim for the sim provider)'}")
    print("now: .venv/bin/python -c 'import infinitrain as it; print(it.randn(2, 3))'")


if __name__ == "__main__":
    main(sys.argv[1:])

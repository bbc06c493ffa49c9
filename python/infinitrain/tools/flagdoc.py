"""Renders docs/train_flags.md from RunConfig's fields (the single source of the train CLI's flags).

./bazelw run //python:flagdoc > docs/train_flags.md
"""

from infinitrain.models import registry
from infinitrain.training import config

PREAMBLE = """# Train flags

Generated from `RunConfig` (`python/infinitrain/training/config.py`) by `./bazelw run //python:flagdoc >
docs/train_flags.md`; `tests/train/test_training_api.py` fails when the two disagree. Every flag is also a `RunConfig`
field of the same name, for Python:

```python fragment
from infinitrain.training import RunConfig, Trainer

Trainer(RunConfig(model="gpt2-tiny", num_iteration=20)).fit()  # on the default corpus (downloaded once)
```

Flags follow InfiniTrain's names; our earlier names are aliases. `--flagfile=FILE` reads flags from a file (one per
line; later flags on the command line win). `python -m infinitrain.train --help` prints this list by group.
"""


def _cell(text):
    return str(text).replace("|", "\\|")


def render():
    lines = [PREAMBLE]
    by_group = {}
    for f in config.flag_fields():
        by_group.setdefault(f.metadata["group"], []).append(f)
    for group, title in config.GROUPS:
        lines += [f"## {title[0].upper()}{title[1:]}", "", "| flag | default | meaning |", "|---|---|---|"]
        for f in by_group.get(group, ()):
            names = " ".join(f"`--{n}`" for n in (f.name, *f.metadata["aliases"]))
            choices = f.metadata["choices"]
            meaning = f.metadata["help"] + (f" One of: {', '.join(choices)}." if choices else "")
            lines.append(f"| {names} | `{config.show_default(f)}` | {_cell(meaning)} |")
        lines.append("")
    lines.append(f"{len(config.flag_fields())} flags.")
    lines += ["", "## Model presets", "", "| --model | what |", "|---|---|"]
    for line in registry.describe():
        name, what = line.split(": ", 1)
        lines.append(f"| `{name}` | {_cell(what)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

"""The benchmark matrix as a markdown table: JSON lines of bench_gpu (framework infinitrain) and
tools/bench/torch_models.py (framework pytorch, mode eager or compile) on standard input, one row per
(model, batch) with tok/s, ms, MFU and peak memory of each and ours/eager, ours/compile. Lines that are not
JSON (a run that failed) are skipped; a missing entry reads '-'. Runs of bench_gpu --fp8 make a second table: FP8
against our bfloat16 step and torch.compile's."""

import json
import sys

PEAK_TFLOPS = 989.0  # H200 dense bf16, as bench_gpu's MFU
SHAPES = {"gpt2": (12, 768), "llama3": (12, 768), "gpt2-xl": (48, 1600), "llama3-1b": (16, 2048)}


def mfu(r):
    layers, width = SHAPES[r["model"]]
    flops = 6 * r["params_M"] * 1e6 + 12 * layers * r["seq"] * width
    return flops * r["tokens_per_s"] / (PEAK_TFLOPS * 1e12)


def main():
    runs = {}
    for line in sys.stdin:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(r, dict) or "tokens_per_s" not in r:
            continue
        kind = ("ours_fp8" if r.get("fp8") else "ours") if r.get("framework") == "infinitrain" else r.get("mode")
        runs.setdefault((r["model"], r["batch"]), {})[kind] = r
    print(
        "| model | B | ours tok/s | eager | compile | ours/eager | ours/compile | ms ours / eager / compile "
        "| MFU ours / compile | peak GB ours / eager / compile |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---|---|")
    for (model, batch), row in runs.items():
        print(row_line(model, batch, row))
    fp8_rows = [(key, row) for key, row in runs.items() if "ours_fp8" in row]
    if fp8_rows:
        print()
        print(
            "| model | B | bf16 tok/s | fp8 tok/s | fp8 / bf16 | fp8 / compile | ms bf16 / fp8 "
            "| peak GB bf16 / fp8 / compile |"
        )
        print("|---|---|---:|---:|---:|---:|---|---|")
        for (model, batch), row in fp8_rows:
            print(fp8_line(model, batch, row))


def row_line(model, batch, row):
    def get(kind, key, fmt):
        r = row.get(kind)
        return "-" if r is None else format(r[key] if key != "mfu" else mfu(r), fmt)

    def ratio(kind):
        if "ours" not in row or kind not in row:
            return "-"
        return f"{row['ours']['tokens_per_s'] / row[kind]['tokens_per_s']:.2f}"

    return (
        f"| {model} | {batch} | {get('ours', 'tokens_per_s', ',')} | {get('eager', 'tokens_per_s', ',')} "
        f"| {get('compile', 'tokens_per_s', ',')} | {ratio('eager')} | {ratio('compile')} "
        f"| {' / '.join(get(k, 'ms_per_step', '.1f') for k in ('ours', 'eager', 'compile'))} "
        f"| {' / '.join(get(k, 'mfu', '.3f') for k in ('ours', 'compile'))} "
        f"| {' / '.join(get(k, 'peak_GB', '.1f') for k in ('ours', 'eager', 'compile'))} |"
    )


def fp8_line(model, batch, row):
    def get(kind, key, fmt):
        r = row.get(kind)
        return "-" if r is None else format(r[key], fmt)

    def ratio(kind):
        if kind not in row:
            return "-"
        return f"{row['ours_fp8']['tokens_per_s'] / row[kind]['tokens_per_s']:.2f}"

    return (
        f"| {model} | {batch} | {get('ours', 'tokens_per_s', ',')} | {get('ours_fp8', 'tokens_per_s', ',')} "
        f"| {ratio('ours')} | {ratio('compile')} "
        f"| {' / '.join(get(k, 'ms_per_step', '.1f') for k in ('ours', 'ours_fp8'))} "
        f"| {' / '.join(get(k, 'peak_GB', '.1f') for k in ('ours', 'ours_fp8', 'compile'))} |"
    )


if __name__ == "__main__":
    main()

"""Trains the README's small GPT-2 for N steps on a device and prints the allocator's statistics at
steps 10 and N, to show that device memory (allocated and reserved) does not grow over a run.

    python3 tools/bench/memory_growth.py --device=cuda --steps=300
"""

import argparse
import json

import numpy as np

import infinitrain as it
from infinitrain.models import GPT2, GPT2Config

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--steps", type=int, default=300)
a = p.parse_args()
it.manual_seed(0)
model = GPT2(GPT2Config(128, 257, 320, 4, 4, 128), a.device)
params = list(model.parameters())
opt = it.optim.AdamW(params, lr=1e-3)
rng = np.random.default_rng(0)
seen = {}
for step in range(1, a.steps + 1):
    data = rng.integers(0, 257, size=(8, 129))
    x, y = it.from_numpy(data[:, :-1], device=a.device), it.from_numpy(data[:, 1:], device=a.device)
    opt.zero_grad()
    with it.amp.autocast(a.device, dtype="bfloat16"):
        _, loss = model(x, y)
    loss.backward()
    it.optim.clip_grad_norm_(params, 1.0)
    opt.step()
    value = loss.item()
    if step in (1, 10, a.steps):
        s = it.runtime.memory_stats(a.device)
        seen[step] = {"loss": round(value, 4), "allocated": s["allocated"], "reserved": s["reserved"]}
print(json.dumps({"device": a.device, "steps": a.steps, "at": seen}))

"""Pipeline schedules: for each stage, the order of its forward ("F", chunk, micro-batch) and backward ("B", ...)
steps. Pure functions, so `simulate` can check a schedule runs (every receive finds its message, each channel's
messages arrive in the order they are consumed) without any process.

    gpipe        every forward, then every backward: a stage holds all micro-batches' activations
    1f1b         stage s runs pp - s - 1 forwards, then alternates one forward and one backward: it holds at most
                 pp - s micro-batches (PipeDream-Flush)
    interleaved  1F1B over vpp chunks per stage (virtual stage v = chunk * pp + stage), micro-batches in groups of
                 pp: a smaller bubble, for a few more activations in flight (Megatron's)
"""


def gpipe(pp, vpp, stage, micro):
    fwd = [("F", c, m) for c in range(vpp) for m in range(micro)]
    bwd = [("B", c, m) for c in reversed(range(vpp)) for m in range(micro)]
    return fwd + bwd


def one_f_one_b(pp, stage, micro):
    warm = min(pp - stage - 1, micro)
    ops = [("F", 0, m) for m in range(warm)]
    for i in range(micro - warm):
        ops += [("F", 0, warm + i), ("B", 0, i)]
    return ops + [("B", 0, i) for i in range(micro - warm, micro)]


def _interleaved_id(k, pp, vpp, backward):
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    return (vpp - 1 - chunk) if backward else chunk, group * pp + within % pp


def interleaved(pp, vpp, stage, micro):
    if micro % pp:
        raise ValueError(f"the interleaved schedule needs micro-batches ({micro}) in multiples of the stages ({pp})")
    total = micro * vpp
    warm = total if micro == pp else min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    ops = [("F", *_interleaved_id(k, pp, vpp, False)) for k in range(warm)]
    for i in range(total - warm):
        ops.append(("F", *_interleaved_id(warm + i, pp, vpp, False)))
        ops.append(("B", *_interleaved_id(i, pp, vpp, True)))
    return ops + [("B", *_interleaved_id(i, pp, vpp, True)) for i in range(total - warm, total)]


def schedule(name, pp, vpp, stage, micro):
    """The ops of `stage`; name "1f1b" (interleaved when vpp > 1) or "gpipe"."""
    if micro < 1:
        raise ValueError(f"a pipeline step needs at least one micro-batch, got {micro}")
    if name == "gpipe":
        return gpipe(pp, vpp, stage, micro)
    if name == "1f1b":
        return interleaved(pp, vpp, stage, micro) if vpp > 1 else one_f_one_b(pp, stage, micro)
    raise ValueError(f"unknown pipeline schedule {name!r}: expected 1f1b or gpipe")


def in_flight(ops):
    """The most micro-batch chunks whose forward ran and whose backward did not, over the ops."""
    live = peak = 0
    for op, _, _ in ops:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    return peak


def simulate(name, pp, vpp, micro):
    """Runs every stage's ops with buffered sends (as the engine's channels are) and checks the data flow:
    raises RuntimeError on a deadlock or a message taken out of order. Returns the number of rounds."""
    V = pp * vpp
    progs = [schedule(name, pp, vpp, s, micro) for s in range(pp)]
    pos = [0] * pp
    queues = {}  # (kind, src stage, dst stage) -> [(virtual stage, micro-batch)]
    done_f, done_b = set(), set()
    rounds = 0
    while any(pos[s] < len(progs[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            if pos[s] >= len(progs[s]):
                continue
            op, c, m = progs[s][pos[s]]
            v = c * pp + s
            if op == "F":
                need = None if v == 0 else ("act", (v - 1) % pp, s, v - 1)
            else:
                if (v, m) not in done_f:
                    raise RuntimeError(f"stage {s}: backward of chunk {c}, micro-batch {m} before its forward")
                need = None if v == V - 1 else ("grad", (v + 1) % pp, s, v + 1)
            if need is not None:
                q = queues.get(need[:3], [])
                if not q:
                    continue
                if q[0] != (need[3], m):
                    raise RuntimeError(f"stage {s}: {need[0]} channel from stage {need[1]} holds {q[0]}, needs "
                                       f"{(need[3], m)}")  # fmt: skip
                q.pop(0)
            if op == "F":
                done_f.add((v, m))
                if v < V - 1:
                    queues.setdefault(("act", s, (v + 1) % pp), []).append((v, m))
            else:
                done_b.add((v, m))
                if v > 0:
                    queues.setdefault(("grad", s, (v - 1) % pp), []).append((v, m))
            pos[s] += 1
            moved = True
        rounds += 1
        if not moved:
            raise RuntimeError(f"{name} pp={pp} vpp={vpp} micro={micro}: deadlock at ops {pos}")
    if len(done_b) != V * micro or any(queues.values()):
        raise RuntimeError(f"{name}: not every backward ran, or messages were left over")
    return rounds


def exchanges(name, pp, vpp, stage, micro):
    """The point-to-point messages of `stage` in program order: (op, kind, peer stage, virtual stage of the
    message, micro-batch), op "send" or "recv"."""
    V = pp * vpp
    out = []
    for op, c, m in schedule(name, pp, vpp, stage, micro):
        v = c * pp + stage
        if op == "F":
            out += [("recv", "act", (v - 1) % pp, v - 1, m)] if v > 0 else []
            out += [("send", "act", (v + 1) % pp, v, m)] if v < V - 1 else []
        else:
            out += [("recv", "grad", (v + 1) % pp, v + 1, m)] if v < V - 1 else []
            out += [("send", "grad", (v - 1) % pp, v, m)] if v > 0 else []
    return out


def simulate_in_line(name, pp, vpp, micro):
    """Runs every stage's messages as if each send waited for its receive in the stage's own order (a device
    CCL's send on the compute stream): raises RuntimeError on the deadlock that 1F1B then meets, which is why the
    engine sends on streams of their own; `simulate` checks the schedules with sends that do not hold the stage."""
    progs = [exchanges(name, pp, vpp, s, micro) for s in range(pp)]
    pos = [0] * pp
    while any(pos[s] < len(progs[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            if pos[s] >= len(progs[s]) or progs[s][pos[s]][0] != "send":
                continue
            _, kind, peer, v, m = progs[s][pos[s]]
            if pos[peer] < len(progs[peer]) and progs[peer][pos[peer]] == ("recv", kind, s, v, m):
                pos[s] += 1
                pos[peer] += 1
                moved = True
        if not moved:
            heads = {s: progs[s][pos[s]] for s in range(pp) if pos[s] < len(progs[s])}
            raise RuntimeError(f"{name} pp={pp} vpp={vpp} micro={micro}: deadlock with in-line sends at {heads}")

"""Where this process sits in a job started by a cluster's own launcher, so that `srun` (Slurm) and `mpirun`
(Open MPI) start a run without infinitrain.run:

    srun --ntasks-per-node=4 python -m infinitrain.train ...
    mpirun -np 8 -x MASTER_ADDR=node01 -x INFINITRAIN_STORE_TOKEN python -m infinitrain.train ...

apply() fills RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the first source
present: infinitrain.run's (or torchrun's) variables, then Open MPI's (OMPI_COMM_WORLD_*, set per process by
mpirun, also inside a Slurm allocation), then Slurm's inside an srun job step (SLURM_STEP_ID set; SLURM_PROCID,
SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID, the tasks per node and the node list). Variables already
set are kept, so a user can override any of them. MASTER_ADDR: Slurm's first node (loopback when the step has
one node), Open MPI's must be given across nodes (loopback on one). MASTER_PORT, when not given: Slurm's 20000 +
job id mod 10000 (jobs sharing a node get different ports), otherwise 29500. Rank 0 serves the rendezvous store;
across nodes every process needs the same INFINITRAIN_STORE_TOKEN (export it before srun or pass it with
mpirun -x).
"""

import os
import re

DEFAULT_PORT = 29500
SLURM_PORT_BASE = 20000


class Place:
    """This process's place in the job, and where its rank 0 serves the store."""

    def __init__(self, source, rank, world_size, local_rank, local_world_size, master_addr, master_port):
        self.source = source
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.master_addr, self.master_port = master_addr, master_port

    def variables(self):
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _int(env, name, lo=0):
    value = env.get(name)
    if value is None or not value.strip().isdigit() or int(value) < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")
    return int(value)


def first_host(nodelist):
    """The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07"; "r[1-2]-n[01-04]" -> "r1-n01")."""
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]  # commas outside brackets separate hosts
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)
    if not host or first.startswith("[") or any(c in host for c in "[],"):
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    return host


def tasks_per_node(spec):
    """Slurm's tasks-per-node list ("4(x2),3" -> [4, 4, 3])."""
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"cannot read Slurm's tasks per node {spec!r} (expected e.g. '4(x2),3')")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _slurm(env):
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_STEP_NUM_TASKS", 1) if "SLURM_STEP_NUM_TASKS" in env else _int(env, "SLURM_NTASKS", 1)
    local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = tasks_per_node(spec) if spec else [world]
    if node >= len(counts):
        raise ValueError(f"SLURM_NODEID={node}, but the tasks per node {spec!r} name {len(counts)} node(s)")
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or str(len(counts))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodes.strip() == "1":
        addr = "127.0.0.1"  # one node: the store stays on loopback
    elif nodelist:
        addr = first_host(nodelist)
    else:
        raise ValueError("Slurm gives no node list (SLURM_STEP_NODELIST or SLURM_JOB_NODELIST): set MASTER_ADDR")
    job = env.get("SLURM_JOB_ID", "")
    port = SLURM_PORT_BASE + int(job) % 10000 if job.isdigit() else DEFAULT_PORT
    return Place("slurm", rank, world, local, counts[node], addr, port)


def _open_mpi(env):
    rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
    local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else world
    if local_world != world and "MASTER_ADDR" not in env:
        raise ValueError(
            f"Open MPI started {world} processes on several nodes: set MASTER_ADDR to the first one's address "
            "(mpirun -x MASTER_ADDR=<host> -x INFINITRAIN_STORE_TOKEN ...)"
        )
    return Place("open-mpi", rank, world, local, local_world, "127.0.0.1", DEFAULT_PORT)


def detect(env=None):
    """This process's Place from the environment (default os.environ), or None outside any launcher. Raises
    ValueError naming a variable it cannot read."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return None  # infinitrain.run's or torchrun's: used as they are
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        place = _open_mpi(
            env
        )  # set per process by mpirun, also inside a Slurm allocation (whose variables it inherits)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env and env.get("SLURM_STEP_ID", "").isdigit():
        place = _slurm(env)  # an srun job step; a batch script's own process is not a rank of anything
    else:
        return None
    if not 0 <= place.rank < place.world_size or not 0 <= place.local_rank < place.local_world_size:
        raise ValueError(
            f"{place.source}: rank {place.rank} of {place.world_size}, local rank {place.local_rank} of "
            f"{place.local_world_size} is not a place in the job"
        )
    return place


def apply(env=None):
    """Sets the variables init_process_group and the trainer read from a cluster launcher's, keeping any already
    set; returns the Place (None when there was nothing to translate)."""
    env = os.environ if env is None else env
    place = detect(env)
    if place is not None:
        for name, value in place.variables().items():
            env.setdefault(name, value)
    return place

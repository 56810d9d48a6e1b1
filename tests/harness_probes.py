"""Probes for tests/test_harness.py (imported by worker processes through PYTHONPATH)."""
import torch
import torch.distributed as dist


def probe_gloo_sum(student, ctx):
    """Call the student's ``reduce(t)`` on a tensor holding the rank; return the result."""
    t = torch.tensor([float(ctx.rank + 1)])
    student.reduce(t)
    return float(t.item())


def probe_value(student, ctx):
    return student.value(ctx.rank)


def probe_world(student, ctx):
    return (ctx.rank, ctx.size, dist.is_initialized() if ctx.backend == "gloo" else None)


def probe_dynamo_loaded(student, ctx):
    """Whether ``torch._dynamo`` (imported by the first optimizer) is loaded when the probe starts."""
    import sys
    return "torch._dynamo" in sys.modules


def probe_pgwatch(student, ctx):
    """Inside ``pgwatch.watching``: an op overload keeps its attributes and its calls are seen,
    and torch.distributed._functional_collectives imports (it registers on the real ops)."""
    import importlib
    import sys
    from exercise_utils import pgwatch
    sys.modules.pop("torch.distributed._functional_collectives", None)
    log = []
    with pgwatch.watching(log):
        importlib.import_module("torch.distributed._functional_collectives")
        overload = torch.ops.c10d.allreduce_.default
        schema = str(overload._schema).split("(")[0]
        t = torch.ones(3)
        dist.all_reduce(t)                      # dist's function -> ProcessGroup.allreduce
    return schema, [name for name, *_ in log], float(t.sum())


def probe_recorder_forms(student, ctx):
    """Every public form of a collective, through the recorder: (events, hidden)."""
    from exercise_utils.recorder import Recorder
    rec = Recorder()
    rec.install(student)
    try:
        dist.all_gather_single(torch.empty(2 * ctx.size), torch.ones(2))
        dist.reduce_scatter_single(torch.empty(2), torch.ones(2 * ctx.size))
        got = [None] * ctx.size if ctx.rank == 0 else None
        dist.gather_object({"rank": ctx.rank}, got, dst=0)
        objects = [ctx.rank]
        dist.broadcast_object_list(objects, src=0)
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * ctx.size), dist.ReduceOp.SUM,
                                   None, True).wait()
        dist.all_gather_into_tensor(output_tensor=torch.empty(ctx.size), input_tensor=torch.ones(1))
        dist.all_gather([torch.empty(2) for _ in range(ctx.size)], torch.ones(2))   # list forms
        dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(ctx.size)])
        dist.all_to_all([torch.empty(1) for _ in range(ctx.size)],
                        [torch.ones(1) for _ in range(ctx.size)])
    finally:
        rec.uninstall()
    return [list(e) for e in rec.take()], rec.take_hidden(), objects


def probe_parent(student, ctx):
    """This rank's parent process: its pid and command line."""
    import os
    import psutil
    return os.getppid(), " ".join(psutil.Process(os.getppid()).cmdline())


def probe_lineage(student, ctx):
    """The pid and command line of this rank's grandparent (the process that forked the
    launch's spawner)."""
    import os
    import psutil
    grand = psutil.Process(psutil.Process(os.getppid()).ppid())
    return grand.pid, " ".join(grand.cmdline())


def probe_salt(student, ctx):
    """This rank's salt, and the salt files of the launch's folder still there when the
    student's code may run (none: every rank took its own first)."""
    import sys
    from pathlib import Path
    out = Path(sys._getframe(1).f_locals["args"].out)      # the worker's: the launch's folder
    return ctx.salt, sorted(p.name for p in out.glob("salt*"))


def probe_collective_bytes(student, ctx, kind, numel, calls):
    """``calls`` calls ``kind`` on a ``numel``-element float32 tensor (the all-reduce's,
    broadcast's and reduce's tensor; the all-gather's whole output, the reduce-scatter's
    input, the scatter's and gather's whole buffer on the root; the all-to-all's input; a
    message from rank 0 to rank 1), in a gloo group the probe sets up itself (``env://``, as
    notebooks 06, 07 and 09's probes do), or through MPI (``ctx.comm``) for the kinds with a
    capital letter (mpi4py's names)."""
    if kind[0].isupper():
        return _mpi_bytes(ctx, kind, numel, calls)
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size)
    n, t = ctx.size, torch.ones(numel)
    part = t[:numel // n].clone()
    for _ in range(calls):
        if kind == "all_reduce":
            dist.all_reduce(t)
        elif kind == "broadcast":
            dist.broadcast(t, 0)
        elif kind == "reduce":
            dist.reduce(t, 0)
        elif kind == "reduce_scatter":
            dist.reduce_scatter_tensor(torch.empty(numel // n), t)
        elif kind == "all_gather":
            dist.all_gather_into_tensor(torch.empty(numel), part)
        elif kind == "gather":
            dist.gather(part, [torch.empty(numel // n) for _ in range(n)] if ctx.rank == 0
                        else None, dst=0)
        elif kind == "scatter":
            dist.scatter(torch.empty(numel // n), [part.clone() for _ in range(n)]
                         if ctx.rank == 0 else None, src=0)
        elif kind == "all_to_all":
            dist.all_to_all_single(torch.empty(numel), t)
        elif kind == "send" and ctx.rank in (0, 1):
            (dist.send if ctx.rank == 0 else dist.recv)(t, 1 - ctx.rank)
    dist.barrier()
    dist.destroy_process_group()
    return ctx.rank


def _mpi_bytes(ctx, kind, numel, calls):
    import numpy as np
    comm, n, root = ctx.comm, ctx.size, ctx.rank == 0
    a = np.ones(numel, dtype=np.float32)
    b, part = np.empty_like(a), np.empty(numel // n, dtype=np.float32)
    for _ in range(calls):
        if kind == "Allreduce":
            comm.Allreduce(a, b)
        elif kind == "Bcast":
            comm.Bcast(a, root=0)
        elif kind == "Reduce":
            comm.Reduce(a, b, root=0)
        elif kind == "Allgather":
            comm.Allgather(a[:numel // n], b)
        elif kind == "Scatter":
            comm.Scatter(a if root else None, part, root=0)
        elif kind == "Gather":
            comm.Gather(a[:numel // n], b if root else None, root=0)
        elif kind == "Send" and ctx.rank in (0, 1):
            (comm.Send if root else comm.Recv)(a, 1 - ctx.rank)
    comm.Barrier()
    return ctx.rank


def probe_leave_traces(student, ctx):
    """Leave a file in /tmp and /dev/shm and a daemon (a new session) on this rank's host;
    return the daemon's pid and the zygote's (this rank's parent)."""
    import os
    import subprocess
    for folder in ("/tmp", "/dev/shm"):
        with open(os.path.join(folder, "dtfs-trace"), "w") as f:
            f.write(str(ctx.rank))
    daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)
    return daemon.pid, os.getppid()


def probe_find_traces(student, ctx, daemon):
    """What this rank's host still holds of :func:`probe_leave_traces`: the files, whether the
    daemon lives; and the zygote's pid (this rank's parent)."""
    import os
    alive = os.path.exists(f"/proc/{daemon}") and "sleep" in open(f"/proc/{daemon}/cmdline").read()
    return ([os.path.exists(os.path.join(f, "dtfs-trace")) for f in ("/tmp", "/dev/shm")],
            alive, os.getppid())


def main():
    """A judge's module run by ``harness.module_command`` (forked from a session's zygote):
    says where it runs and with what, and exits with the status its command line names."""
    import os
    import sys
    parent = " ".join(open(f"/proc/{os.getppid()}/cmdline").read().split("\0"))
    print(f"module-main args={sys.argv[1:]} torch={'torch' in sys.modules} parent={parent}",
          flush=True)
    return int(sys.argv[-1])


def probe_point_to_point_forms(student, ctx):
    """One call of each public point-to-point form, rank 0 sending to rank 1, under each
    recorder of the course that sees point-to-point messages (notebooks 03, 08, 10): what
    each logged, as ``(name, elements, peer)`` (peer None where a recorder keeps none)."""
    from exercise_utils.bonus_model_parallel.probes_pp import recording as pp_recording
    from exercise_utils.bonus_powersgd.probes import Recorder as PowerSGDRecorder
    from exercise_utils.torch_distributed_collectives.probes_ring import recording
    peer = 1 - ctx.rank
    sending = ctx.rank == 0

    def forms():
        t = torch.arange(5.0) if sending else torch.zeros(5)
        if sending:
            dist.send(t, dst=peer)
            dist.isend(t, dst=peer).wait()
            dist.send(t, group_dst=peer)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer)]):
                work.wait()
        else:
            dist.recv(t, src=peer)
            dist.irecv(t, src=peer).wait()
            dist.recv(t, group_src=peer)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, peer)]):
                work.wait()
        dist.barrier()

    logged = {}
    with recording(student) as rec:
        forms()
    logged["03"] = [tuple(e) for e in rec.take() if e[0] != "barrier"]
    with PowerSGDRecorder(student) as rec:
        forms()
    logged["08"] = [(name, numel, None) for name, numel, _, _ in rec.take()]
    with pp_recording(student, {peer}) as rec:
        forms()
    logged["10"] = [tuple(e) for e in rec.take() if e[0] != "barrier"]
    return logged


def probe_spawn_workers(student, ctx, folder):
    """Start a ``spawn`` worker of the student's module for each way a worker can end and
    return what each saw and how it ended (tests/test_spawn_template.py compares this with
    the template (``exercise_utils.spawn_template``) and without)."""
    import importlib
    import multiprocessing
    import os
    import signal
    import sys
    from exercise_utils import spawn_template
    sys.path.insert(0, os.path.dirname(student.__file__))
    module = importlib.import_module("spawned_student")
    module.STATE["parent"] = True                 # a fork would see this; a spawn must not
    os.environ["SPAWN_SEEN"] = "from the parent"  # set after start-up: the worker sees it
    signal.signal(signal.SIGUSR1, lambda *a: None)    # a handler: the worker has the default
    os.chdir(folder)
    ctx_ = multiprocessing.get_context("spawn")
    found = {}
    saved = os.dup(1)               # the workers' output: into a file, through descriptor 1
    out = os.open(os.path.join(folder, "stdout"), os.O_WRONLY | os.O_CREAT)
    os.dup2(out, 1)
    os.close(out)
    for mode in ("ok", "raise", "exit3", "kill", "threads_atexit", "term"):
        parent, child = ctx_.Pipe()
        proc = ctx_.Process(target=module.observe, args=(child, mode, folder))
        proc.start()
        child.close()
        seen = parent.recv()
        if mode == "term":
            proc.terminate()
        proc.join(60)
        seen["exitcode"] = proc.exitcode
        seen["is_child"] = seen.pop("pid") == proc.pid and seen.pop("ppid") == os.getpid()
        found[mode] = seen
    os.dup2(saved, 1)
    os.close(saved)
    with open(os.path.join(folder, "stdout")) as printed:
        stdout = printed.read()
    return {"stdout": stdout, "workers": found, "spawned": spawn_template.spawned(),
            "atexit": sorted(os.listdir(folder))}


probe_spawn_workers.spawn_template = True

"""A one-node SLURM cluster that a test starts and stops itself (root and apt-get needed).

Debian's ``slurmctld slurmd slurm-client munge`` are installed with apt-get when missing;
``munged`` runs as the munge user, ``slurmctld`` and ``slurmd`` in the foreground as children
of the test, with ``slurm.conf``, state, spool, pid and log files in a temporary folder and
``SLURM_CONF`` pointing there (the machine's own ``/etc/slurm`` is never touched). The node is
the machine's short hostname with ``CPUs=2``; ports are free ones, so a cluster already
running on the machine is not disturbed. :meth:`LocalSlurm.stop` kills every daemon it
started by pid (and any job step left), whatever happened.

Used by tests/test_slurm.py.
"""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from exercise_utils.launch import free_port

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
DAEMONS = ["slurmctld", "slurmd", "sbatch", "munged"]


def unavailable():
    """Why a local SLURM cannot run here (None when it can), installing it if needed."""
    if os.geteuid() != 0:
        return "a local SLURM needs root (munged, slurmd)"
    if all(shutil.which(d) or Path("/usr/sbin", d).exists() for d in DAEMONS):
        return None
    if not shutil.which("apt-get"):
        return "slurm and munge are not installed and there is no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            return "apt-get install slurm failed: " + proc.stderr[-500:]
    return None


CONF = """ClusterName=dtfs
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class LocalSlurm:
    """``with LocalSlurm(folder) as slurm:`` a running one-node cluster; ``slurm.env`` has
    ``SLURM_CONF`` for the client commands (sbatch, squeue, sinfo, srun)."""

    def __init__(self, folder, cpus=2):
        self.folder, self.cpus = Path(folder), cpus
        self.host = socket.gethostname().split(".")[0]
        self.procs = []
        self.env = {**os.environ, "SLURM_CONF": str(self.folder / "slurm.conf")}

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, ready_within=60):
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        (self.folder / "slurm.conf").write_text(CONF.format(
            host=self.host, d=self.folder, cpus=self.cpus, ctld_port=free_port(), d_port=free_port()))
        run = Path("/run/munge")
        run.mkdir(exist_ok=True)
        shutil.chown(run, "munge", "munge")
        self._spawn(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground"], "munged")
        self._wait(lambda: (run / "munge.socket.2").exists(), 20, "munged did not start")
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld")
        self._spawn(["/usr/sbin/slurmd", "-D"], "slurmd")
        self._wait(self._idle, ready_within, "the node did not become idle")

    def _spawn(self, cmd, name):
        log = open(self.folder / f"{name}.out", "w")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        log.close()

    def _idle(self):
        out = self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout
        return "idle" in out

    def _wait(self, ready, seconds, what):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            if ready():
                return
            time.sleep(0.5)
        logs = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
                       for p in sorted(self.folder.glob("*.out")) + sorted(self.folder.glob("*.log")))
        raise RuntimeError(f"local SLURM: {what}{logs}")

    def run(self, cmd, check=True, timeout=60):
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stdout}{proc.stderr}")
        return proc

    def wait_for_jobs(self, job_ids, timeout):
        """Wait until none of ``job_ids`` is queued or running; return the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            out = self.run(["squeue", "-h", "-o", "%i", "-j", ",".join(map(str, job_ids))],
                           check=False).stdout
            if not out.strip():
                return time.monotonic() - start
            time.sleep(1)
        raise TimeoutError(f"SLURM jobs {job_ids} still queued or running after {timeout} s")

    def stop(self):
        if self.procs and self.procs[-1].poll() is None:
            self.run(["scancel", "--full", "-u", "root"], check=False)
        for proc in reversed(self.procs):      # each in a session of its own: its whole group
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:    # reaped: its pid may be another's by now
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            proc.wait()
        self.procs = []

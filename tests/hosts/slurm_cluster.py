"""A real Slurm cluster for tests: munged + slurmctld + slurmd (+ slurmdbd and a private MariaDB), all as root.

Built from the measured recipe (shared/notes/slurm-test-cluster.md), in Python so that every run gets its
own ports and directory and two copies of the suite can run side by side on one machine:

    BASE/ etc/ (slurm.conf gres.conf slurmdbd.conf)  munge/ (socket)  munge-key/  state/  log/  run/
          dev/nvidia0 nvidia1   fake GPU device nodes (char, NVIDIA major 195; nothing behind them)
          mysql/                the private MariaDB of slurmdbd: a link to /dev/shm/runner-slurmdb-<pid>-…
                                (its ~1000 fsyncs at creation take 6 s on a busy disk, 2 s on tmpfs)
          out/                  cwd of client commands: default slurm-%j.out files land here

Every daemon runs in the foreground (`-D`, `--foreground`) as a child of the test process, in its own
session, with PR_SET_PDEATHSIG so a killed pytest leaks none. Clients find the cluster through SLURM_CONF
(`cluster.env`, `cluster.run([...])`). Nodes `node1`.. each have 2 CPUs, 1000 MB and `Gres=gpu:2`, in the
one partition `debug`.

Why slurmdbd and MariaDB by default: a production cluster answers `sacct --json` from slurmdbd, and that is
where a job's final state comes from once squeue forgets it. The jobcomp/filetxt log (`sacct -c`) has no
JSON, no exit code and no reason, so it cannot stand in for it. It costs ~2 s of start-up, once a session.

Teardown (`stop`) cancels all jobs, stops the daemons it started (by PID: TERM, then KILL after 10 s),
then kills by PID any process still carrying this cluster's SLURM_CONF in its environment (slurmstepd and
job processes outlive slurmd when slurmctld died first), and removes BASE.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._proc import die_with_parent, free_port, host_workdir, pid_alive, port_accepts, wait_until

SHM = Path("/dev/shm")
CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SQUEUE_", "SACCT_", "SRUN_", "SALLOC_", "SCANCEL_", "SINFO_")

PARTITION = "debug"
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2
MEMORY_MB = 1000
NVIDIA_MAJOR = 195
START_TIMEOUT = 60.0
DB_USER, DB_PASSWORD = "slurm", "slurmpw"
TOOLS = {"munged": "munge", "mungekey": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
         "sbatch": "slurm-client", "squeue": "slurm-client", "sacct": "slurm-client", "sinfo": "slurm-client"}
DB_TOOLS = {"slurmdbd": "slurmdbd", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
            "mariadb": "mariadb-client"}


@dataclass
class Ports:
    ctld: int
    slurmd: list[int]
    dbd: int
    mysql: int

    @classmethod
    def pick(cls, nodes: int) -> "Ports":
        return cls(ctld=free_port(), slurmd=[free_port() for _ in range(nodes)], dbd=free_port(),
                   mysql=free_port())


@dataclass
class SlurmCluster:
    """A running test cluster; `run` executes a Slurm client against it."""

    base: Path
    nodes: list[str]
    ports: Ports
    accounting: bool
    env: dict[str, str]
    min_job_age: int = 300  # s slurmctld keeps an ended job (squeue shows it); Slurm's least is 2
    startup_s: float = 0.0
    db_dir: Path | None = None  # where BASE/mysql points, when it is on tmpfs
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def out_dir(self) -> Path:
        return self.base / "out"

    def run(self, argv: list[str], *, timeout: float = 30, check: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        """A client command (sbatch, squeue, …) against this cluster, cwd = BASE/out."""
        return subprocess.run(argv, env=self.env, cwd=self.out_dir, capture_output=True, text=True,
                              timeout=timeout, check=check, **kwargs)

    def sbatch(self, *args: str, timeout: float = 30) -> str:
        """`sbatch --parsable ARGS…`; the job id. Raises CalledProcessError (stderr has Slurm's reason)."""
        done = self.run(["sbatch", "--parsable", *args], timeout=timeout, check=True)
        return done.stdout.strip().split(";")[0]

    def job_field(self, job_id: str, name: str) -> str:
        """One field of `scontrol show job` (e.g. JobState, Reason, ExitCode)."""
        text = self.run(["scontrol", "-o", "show", "job", job_id], check=True).stdout
        for word in text.split():
            key, _, value = word.partition("=")
            if key == name:
                return value
        raise KeyError(f"{name} not in scontrol output: {text!r}")

    def wait_job_state(self, job_id: str, states: set[str], timeout: float = 30) -> str:
        """Poll squeue/scontrol until the job's JobState is one of `states`; return it."""
        seen = []

        def reached() -> bool:
            seen.append(self.job_field(job_id, "JobState"))
            return seen[-1] in states

        wait_until(reached, timeout, f"job {job_id} to reach {sorted(states)} (last seen {seen[-1:]})", 0.1)
        return seen[-1]

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.base / "log" / f"{name}.out"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_slurmctld(self) -> None:
        """SIGTERM slurmctld and wait for it (jobs keep running: slurmstepd does not need it)."""
        _stop_processes([self.daemons.pop("slurmctld")])

    def start_slurmctld(self, timeout: float = START_TIMEOUT) -> None:
        """Start slurmctld again on the saved state; returns once every node is idle or allocated."""
        _spawn(self, "slurmctld", ["slurmctld", "-D"])
        wait_until(lambda: self.run(["sinfo", "-h"], timeout=5).returncode == 0, timeout, "slurmctld to answer", 0.1)

    def stop(self) -> None:
        """End every job, stop the daemons (slurm's first, then slurmdbd, MariaDB, munged), remove BASE."""
        try:
            if "slurmctld" in self.daemons and pid_alive(self.daemons["slurmctld"].pid):
                self._cancel_all_jobs()
            slurm = [name for name in self.daemons if name.startswith(("slurmd-", "slurmctld"))]
            _stop_processes([self.daemons.pop(name) for name in slurm])
            _stop_processes([self.daemons.pop(name) for name in list(self.daemons)])
            _kill_pids(_pids_with_env("SLURM_CONF", str(self.conf)))
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
            if self.db_dir is not None:
                shutil.rmtree(self.db_dir, ignore_errors=True)

    def _cancel_all_jobs(self) -> None:
        """scancel every live job by id (`scancel --state=` takes one state only), wait until none is left."""
        try:
            jobs = self._live_jobs()
            if jobs:
                self.run(["scancel", *jobs], timeout=10)
                wait_until(lambda: not self._live_jobs(), 15, "all jobs to end", 0.1)
        except (TimeoutError, subprocess.TimeoutExpired):
            pass  # the environment sweep in stop() kills what is left

    def _live_jobs(self) -> list[str]:
        return self.run(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"], timeout=10).stdout.split()


def missing_prerequisites(accounting: bool = True) -> list[str]:
    """Why this machine cannot run the cluster (empty when it can)."""
    missing = [] if os.geteuid() == 0 else ["not root (the Slurm daemons run as root; mknod needs it)"]
    tools = dict(TOOLS, **(DB_TOOLS if accounting else {}))
    missing += [f"no {tool} on PATH (tests/hosts/install_slurm.sh installs {package})"
                for tool, package in tools.items() if shutil.which(tool) is None]
    if not Path("/sys/fs/cgroup").is_dir() or not any(Path("/sys/fs/cgroup").iterdir()):
        missing.append("/sys/fs/cgroup is not mounted (slurmd loads its cgroup plugin at start)")
    return missing


def start_slurm_cluster(nodes: int = 1, accounting: bool = True, timeout: float = START_TIMEOUT,
                        min_job_age: int = 300) -> SlurmCluster:
    """Start a fresh cluster of `nodes` nodes; returns once every node is idle, or raises (after cleaning up).
    A small `min_job_age` (seconds, at least 2) makes slurmctld forget ended jobs soon: squeue then says
    "Invalid job id" and only sacct still knows them."""
    # A daemon that died while starting is not what a test tests (mariadbd: a port taken since it was picked, or its
    # SIGSEGV with two suites on 2 cores): a fresh cluster, on new ports, up to three times.
    first: DaemonDied | None = None
    for attempt in range(3):
        try:
            return _start_once(nodes, accounting, timeout, min_job_age)
        except DaemonDied as died:
            if attempt == 2:
                raise DaemonDied(f"three times; the first: {first}\nthe last: {died}") from died
            first = first or died
    raise AssertionError("unreachable")


def _start_once(nodes: int, accounting: bool, timeout: float, min_job_age: int) -> SlurmCluster:
    begin = time.monotonic()
    cluster = _new_cluster(nodes, accounting)
    cluster.min_job_age = min_job_age
    try:
        _write_files(cluster)
        _start_daemons(cluster, begin + timeout)
    except BaseException:
        cluster.stop()
        raise
    cluster.startup_s = time.monotonic() - begin
    return cluster


def _new_cluster(nodes: int, accounting: bool) -> SlurmCluster:
    base = host_workdir("slurm")
    for sub in ("etc", "munge", "munge-key", "state/ctld", "log", "run", "dev", "out"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    db_dir = _tmpfs_dir("slurmdb") if accounting else None
    if db_dir is not None:
        (base / "mysql").symlink_to(db_dir)
    elif accounting:
        (base / "mysql").mkdir()
    names = [f"node{k}" for k in range(1, nodes + 1)]
    for name in names:
        (base / "state" / f"slurmd-{name}").mkdir()
    # a test run inside a Slurm job (or with SBATCH_* defaults set) must not leak them into this cluster
    env = {key: value for key, value in os.environ.items() if not key.startswith(CLIENT_ENV_PREFIXES)}
    env["SLURM_CONF"] = str(base / "etc" / "slurm.conf")
    return SlurmCluster(base=base, nodes=names, ports=Ports.pick(nodes), accounting=accounting, env=env,
                        db_dir=db_dir)


def _tmpfs_dir(kind: str) -> Path | None:
    """/dev/shm/runner-<kind>-<our pid>-XXXX, after removing such dirs whose test process is gone; None
    where /dev/shm is not a writable tmpfs."""
    if not (SHM.is_dir() and os.access(SHM, os.W_OK) and _is_tmpfs(SHM)):
        return None
    for stale in SHM.glob(f"runner-{kind}-*-*"):
        owner = re.fullmatch(rf"runner-{kind}-(\d+)-\w+", stale.name)
        if owner and not pid_alive(int(owner.group(1))):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"runner-{kind}-{os.getpid()}-", dir=SHM))


def _is_tmpfs(path: Path) -> bool:
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    return any(fields[1] == str(path) and fields[2] == "tmpfs" for fields in mounts)


def _write_files(cluster: SlurmCluster) -> None:
    base = cluster.base
    (base / "munge").chmod(0o755)  # munged: the socket's dir must be world-executable
    (base / "munge-key").chmod(0o700)
    key = base / "munge-key" / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o400)
    for index in range(GPUS_PER_NODE):  # Slurm only stat()s them; 22.05 needs char devices for gpu GRES
        os.mknod(base / "dev" / f"nvidia{index}", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
    (base / "etc" / "slurm.conf").write_text(slurm_conf_text(base, cluster.nodes, cluster.ports, cluster.accounting,
                                                                    cluster.min_job_age))
    (base / "etc" / "gres.conf").write_text(gres_conf_text(base, cluster.nodes))
    if cluster.accounting:
        dbd_conf = base / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(slurmdbd_conf_text(base, cluster.ports))
        dbd_conf.chmod(0o600)  # slurmdbd refuses a group- or world-readable slurmdbd.conf


def slurm_conf_text(base: Path, nodes: list[str], ports: Ports, accounting: bool, min_job_age: int = 300) -> str:
    if accounting:
        acct = ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
                f"AccountingStoragePort={ports.dbd}",
                # without this, slurmctld and sacct talk to slurmdbd through the system's munge socket
                f"AccountingStoragePass=socket={base}/munge/munge.sock", "AccountingStorageTRES=gres/gpu"]
    else:
        acct = ["AccountingStorageType=accounting_storage/none"]
    node_lines = [
        f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname=localhost Port={port} CPUs={CPUS_PER_NODE} Boards=1 "
        f"SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 RealMemory={MEMORY_MB} "
        f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN" for name, port in zip(nodes, ports.slurmd)]
    lines = [
        "ClusterName=runnertest", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ports.ctld}",
        f"SlurmdPort={ports.slurmd[0]}", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={base}/munge/munge.sock", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={base}/state/ctld", f"SlurmdSpoolDir={base}/state/slurmd-%n",
        f"SlurmctldPidFile={base}/run/slurmctld.pid", f"SlurmdPidFile={base}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log", f"SlurmdLogFile={base}/log/slurmd-%n.log",
        "SlurmctldDebug=info", "SlurmdDebug=info", "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/linux",
        "MpiDefault=none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=100",  # without it every job takes the node's whole memory and jobs run one at a time
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=2,bf_interval=1",
        "SlurmdParameters=config_overrides", "CommunicationParameters=NoInAddrAny", "ReturnToService=2",
        *acct, "JobCompType=jobcomp/filetxt", f"JobCompLoc={base}/log/jobcomp.txt", "GresTypes=gpu",
        "KillWait=5", "InactiveLimit=0", f"MinJobAge={min_job_age}", "SlurmctldTimeout=30", "SlurmdTimeout=30",
        *node_lines, f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf_text(base: Path, nodes: list[str]) -> str:
    return "".join(f"NodeName={name} Name=gpu File={base}/dev/nvidia[0-{GPUS_PER_NODE - 1}]\n" for name in nodes)


def slurmdbd_conf_text(base: Path, ports: Ports) -> str:
    lines = ["AuthType=auth/munge", f"AuthInfo=socket={base}/munge/munge.sock", "DbdHost=localhost",
             "DbdAddr=127.0.0.1", f"DbdPort={ports.dbd}", "SlurmUser=root", "DebugLevel=info",
             f"LogFile={base}/log/slurmdbd.log", f"PidFile={base}/run/slurmdbd.pid",
             "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={ports.mysql}",
             f"StorageUser={DB_USER}", f"StoragePass={DB_PASSWORD}", "StorageLoc=slurm_acct_db"]
    return "\n".join(lines) + "\n"


def _start_daemons(cluster: SlurmCluster, deadline: float) -> None:
    base = cluster.base
    install_db = _start_db_install(cluster) if cluster.accounting else None  # slowest step: overlap it
    _spawn(cluster, "munged", ["munged", "--foreground", f"--socket={base}/munge/munge.sock",
                               f"--key-file={base}/munge-key/munge.key", f"--pid-file={base}/run/munged.pid",
                               f"--log-file={base}/log/munged.log", f"--seed-file={base}/munge/munged.seed"])
    _wait(cluster, "munged", lambda: (base / "munge" / "munge.sock").is_socket(), deadline)
    if install_db is not None:
        _start_accounting(cluster, install_db, deadline)
    _spawn(cluster, "slurmctld", ["slurmctld", "-D"])
    for name in cluster.nodes:
        _spawn(cluster, f"slurmd-{name}", ["slurmd", "-D", "-N", name])
    _wait(cluster, "slurmctld", lambda: _idle_nodes(cluster) == set(cluster.nodes), deadline)


def _start_db_install(cluster: SlurmCluster) -> subprocess.Popen:
    log = open(cluster.base / "log" / "mariadb-install.out", "wb")
    with log:
        return subprocess.Popen(
            ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={cluster.base}/mysql/data",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent)


def _start_accounting(cluster: SlurmCluster, install_db: subprocess.Popen, deadline: float) -> None:
    base, ports = cluster.base, cluster.ports
    if install_db.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
        # Once in ~10 suites run two at a time on 2 cores it exited 1 (the cause scrolled out of the tail we kept):
        # keep the whole first log, start the data dir afresh and try once more.
        first = (base / "log" / "mariadb-install.out").read_text(errors="replace")
        (base / "log" / "mariadb-install.first.out").write_text(first)
        shutil.rmtree(base / "mysql" / "data", ignore_errors=True)
        retry = _start_db_install(cluster)
        if retry.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
            raise RuntimeError(f"mariadb-install-db failed twice; the first run said:\n{first[:3000]}\n"
                               f"the second:\n{cluster.log_tail('mariadb-install')}")
    sock = base / "mysql" / "mysql.sock"
    _spawn(cluster, "mariadbd", [
        "mariadbd", "--no-defaults", "--user=root", f"--datadir={base}/mysql/data", f"--socket={sock}",
        f"--port={ports.mysql}", "--bind-address=127.0.0.1", "--skip-name-resolve",
        f"--pid-file={base}/run/mariadbd.pid", "--innodb-buffer-pool-size=64M",
        "--innodb-lock-wait-timeout=900"])
    _wait(cluster, "mariadbd", lambda: _sql(sock, "select 1").returncode == 0, deadline)
    grant = (f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
             f"GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1';")
    done = _sql(sock, grant)
    if done.returncode != 0:
        raise RuntimeError(f"creating the slurmdbd database user failed: {done.stderr}")
    _spawn(cluster, "slurmdbd", ["slurmdbd", "-D"])
    # slurmdbd creates its schema on a fresh database before it listens; slurmctld must find it listening
    _wait(cluster, "slurmdbd", lambda: port_accepts("127.0.0.1", ports.dbd), deadline)


def _sql(sock: Path, statement: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mariadb", "--no-defaults", "-S", str(sock), "-uroot", "-e", statement],
                          capture_output=True, text=True, timeout=10)


def _spawn(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    with open(cluster.base / "log" / f"{name}.out", "wb") as log:
        cluster.daemons[name] = subprocess.Popen(argv, env=cluster.env, cwd=cluster.base, stdin=subprocess.DEVNULL,
                                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                                 preexec_fn=die_with_parent)


class DaemonDied(RuntimeError):
    """A daemon the cluster started exited while the cluster was starting."""


def _wait(cluster: SlurmCluster, what: str, ready, deadline: float) -> None:
    """Poll `ready` until the deadline; fail at once, with the log tail, when a daemon we started died."""
    while not ready():
        dead = [name for name, proc in cluster.daemons.items() if proc.poll() is not None]
        if dead:
            raise DaemonDied(f"{dead[0]} exited with {cluster.daemons[dead[0]].returncode} while waiting for "
                             f"{what}:\n{cluster.log_tail(dead[0])}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}:\n{cluster.log_tail(what)}")
        time.sleep(0.05)


def _idle_nodes(cluster: SlurmCluster) -> set[str]:
    try:
        done = cluster.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], timeout=5)
    except subprocess.TimeoutExpired:
        return set()
    return set(done.stdout.split()) if done.returncode == 0 else set()


def _stop_processes(processes: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM them all at once, wait up to `grace` s, SIGKILL what is left; reap each."""
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pids_with_env(key: str, value: str) -> list[int]:
    """Processes whose environment has KEY=VALUE: descendants of this cluster's daemons and jobs."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill_pids(pids: list[int]) -> None:
    """TERM, up to 5 s, then KILL: for job processes that outlived their daemons."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass

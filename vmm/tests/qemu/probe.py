"""Probes, inside the guest, the kernel features a Debian/Python userland and
pvisor's agent rely on. Run as root in the sandbox root (erofs + overlay) by
the qemu_userland test; prints one `PVISOR-PROBE ok|FAIL <name>` line per check
and `PVISOR-PROBE-DONE` at the end."""

import ctypes
import errno
import fcntl
import mmap
import multiprocessing
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def check_libc(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def bash_and_sh():
    out = subprocess.run(["bash", "-c", 'echo "$BASH_VERSION" $((6*7))'], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1] == "42", out.stdout
    out = subprocess.run(["/bin/sh", "-c", "echo $0"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "/bin/sh", out.stdout


@check
def pty():
    leader, follower = os.openpty()
    name = os.ttyname(follower)
    assert name.startswith("/dev/pts/"), name
    os.write(follower, b"through the pty\n")
    assert b"through the pty" in os.read(leader, 100)


@check
def multiprocessing_pool_and_shm():
    # POSIX semaphores live in /dev/shm; the pool forks workers.
    with multiprocessing.Pool(2) as pool:
        assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    lock = multiprocessing.Lock()
    with lock:
        pass


@check
def threads_and_futex():
    counter = [0]
    cv = threading.Condition()

    def work():
        for _ in range(100):
            with cv:
                counter[0] += 1
                cv.notify_all()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 800


@check
def epoll_eventfd_pipe():
    ep = select.epoll()
    efd = os.eventfd(0)
    ep.register(efd, select.EPOLLIN)
    os.eventfd_write(efd, 3)
    assert ep.poll(1) == [(efd, select.EPOLLIN)]
    assert os.eventfd_read(efd) == 3


@check
def timerfd_signalfd():
    CLOCK_MONOTONIC = 1
    tfd = check_libc(libc.timerfd_create(CLOCK_MONOTONIC, 0), "timerfd_create")
    spec = struct.pack("qqqq", 0, 0, 0, 1_000_000)  # it_interval, it_value = 1 ms
    check_libc(libc.timerfd_settime(tfd, 0, spec, None), "timerfd_settime")
    assert struct.unpack("Q", os.read(tfd, 8))[0] >= 1
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    mask = ctypes.c_uint64(1 << (signal.SIGUSR1 - 1))
    sfd = check_libc(libc.signalfd(-1, ctypes.byref(mask), 0), "signalfd")
    os.kill(os.getpid(), signal.SIGUSR1)
    info = os.read(sfd, 128)
    assert struct.unpack_from("I", info)[0] == signal.SIGUSR1


@check
def posix_timers_and_clocks():
    timerid = ctypes.c_void_p()
    check_libc(libc.timer_create(1, None, ctypes.byref(timerid)), "timer_create")
    check_libc(libc.timer_delete(timerid), "timer_delete")
    for clock in (time.CLOCK_MONOTONIC, time.CLOCK_REALTIME, time.CLOCK_BOOTTIME):
        assert time.clock_gettime(clock) >= 0


@check
def inotify():
    fd = check_libc(libc.inotify_init1(os.O_NONBLOCK), "inotify_init1")
    check_libc(libc.inotify_add_watch(fd, b"/tmp", 0x100), "inotify_add_watch")  # IN_CREATE
    open("/tmp/inotify-probe", "w").close()
    assert len(os.read(fd, 4096)) >= 16


@check
def memfd_madvise_fadvise():
    fd = os.memfd_create("probe", os.MFD_CLOEXEC)
    os.ftruncate(fd, 1 << 20)
    m = mmap.mmap(fd, 1 << 20)
    m.madvise(mmap.MADV_DONTNEED)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)


@check
def file_locks():
    with open("/tmp/lock-probe", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@check
def sysv_ipc_and_mqueue():
    IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0
    shmid = check_libc(libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600), "shmget")
    check_libc(libc.shmctl(shmid, IPC_RMID, None), "shmctl")
    semid = check_libc(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600), "semget")
    check_libc(libc.semctl(semid, 0, IPC_RMID), "semctl")
    mq = check_libc(libc.mq_open(b"/probe", os.O_CREAT | os.O_RDWR, 0o600, None), "mq_open")
    check_libc(libc.mq_close(mq), "mq_close")
    check_libc(libc.mq_unlink(b"/probe"), "mq_unlink")


@check
def aio():
    ctx = ctypes.c_ulong(0)
    check_libc(libc.syscall(206, 8, ctypes.byref(ctx)), "io_setup")  # __NR_io_setup
    check_libc(libc.syscall(207, ctx), "io_destroy")


@check
def getrandom():
    # The pool is ready by the time userland runs (RANDOM_TRUST_CPU): no wait.
    assert len(os.getrandom(32, os.GRND_NONBLOCK)) == 32
    with open("/dev/urandom", "rb") as f:
        assert len(f.read(32)) == 32


@check
def tcp_udp_v4_v6_loopback():
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        srv = socket.socket(family, socket.SOCK_STREAM)
        srv.bind((addr, 0))
        srv.listen()
        cli = socket.create_connection(srv.getsockname()[:2])
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        u = socket.socket(family, socket.SOCK_DGRAM)
        u.bind((addr, 0))
        u.sendto(b"dgram", u.getsockname())
        assert u.recv(5) == b"dgram"


@check
def unix_sockets_and_fd_passing():
    a, b = socket.socketpair()
    r, w = os.pipe()
    socket.send_fds(a, [b"fd"], [w])
    msg, fds, _, _ = socket.recv_fds(b, 2, 1)
    os.write(fds[0], b"x")
    assert msg == b"fd" and os.read(r, 1) == b"x"


@check
def vsock_and_packet_families():
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()


@check
def namespaces():
    flags = {
        "user": 0x10000000,
        "mnt": 0x00020000,
        "pid": 0x20000000,
        "net": 0x40000000,
        "uts": 0x04000000,
        "ipc": 0x08000000,
        "cgroup": 0x02000000,
        "time": 0x00000080,
    }
    for name, flag in flags.items():
        pid = os.fork()
        if pid == 0:
            code = 0 if libc.unshare(flag) == 0 else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"unshare({name}) failed"
        assert os.path.exists(f"/proc/self/ns/{name}"), name


@check
def seccomp_filter():
    # A filter that fails uname(2) with EPERM and allows everything else.
    BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
    SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
    insns = [
        (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (BPF_JEQ_K, 0, 1, 63),  # __NR_uname
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    prog = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxP", len(insns), ctypes.addressof(buf))
    pid = os.fork()
    if pid == 0:
        try:
            check_libc(libc.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
            check_libc(libc.syscall(317, 1, 0, fprog), "seccomp(SET_MODE_FILTER)")  # __NR_seccomp
            try:
                os.uname()
            except PermissionError:
                os._exit(0)
            os._exit(2)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"exit {os.waitstatus_to_exitcode(status)}"


@check
def cgroup_v2_controllers():
    root = "/sys/fs/cgroup"
    controllers = open(f"{root}/cgroup.controllers").read().split()
    for c in ("cpuset", "cpu", "memory", "pids"):
        assert c in controllers, controllers
    with open(f"{root}/cgroup.subtree_control", "w") as f:
        f.write("+memory +pids +cpu")
    os.mkdir(f"{root}/probe")
    with open(f"{root}/probe/memory.max", "w") as f:
        f.write("64M")
    with open(f"{root}/probe/pids.max", "w") as f:
        f.write("16")
    with open(f"{root}/probe/cpu.max", "w") as f:
        f.write("50000 100000")
    with open(f"{root}/probe/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    assert open("/proc/self/cgroup").read().strip() == "0::/probe"
    with open(f"{root}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    os.rmdir(f"{root}/probe")


@check
def overlay_root_is_writable_with_xattrs():
    with open("/etc/probe-written", "w") as f:
        f.write("x")
    os.setxattr("/etc/probe-written", "user.pvisor", b"1")
    assert os.getxattr("/etc/probe-written", "user.pvisor") == b"1"
    os.rename("/etc/debian_version", "/etc/debian_version.moved")  # a file of the lower layer
    assert open("/etc/debian_version.moved").read().startswith("12")
    os.makedirs("/var/probe/a")
    os.rename("/var/probe", "/var/probe-moved")  # a directory of the upper layer
    os.unlink("/etc/debian_version.moved")
    assert not os.path.exists("/etc/debian_version")


@check
def python_stdlib_native_modules():
    import hashlib, sqlite3, ssl, zlib  # noqa: E401

    assert hashlib.sha256(b"").hexdigest().startswith("e3b0c442")
    sqlite3.connect(":memory:").execute("select 1").fetchall()
    assert zlib.decompress(zlib.compress(b"z")) == b"z"
    ssl.create_default_context()


failed = 0
for fn in CHECKS:
    try:
        fn()
        print(f"PVISOR-PROBE ok {fn.__name__}", flush=True)
    except BaseException as e:  # noqa: BLE001 - report every failure and go on
        failed += 1
        detail = "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " | ")
        print(f"PVISOR-PROBE FAIL {fn.__name__}: {detail}", flush=True)
print(f"PVISOR-PROBE-DONE {len(CHECKS)} checks, {failed} failed", flush=True)
sys.exit(0)

//! Installs the filters for real and checks what the kernel then does.
//!
//! `apply_to_thread` affects only the calling thread, so each check runs in a fresh thread.
//! Every "denied" probe is also run in a fresh thread *without* the filter, which must not
//! fail the same way: the tests run as root, and that control shows the refusal comes from
//! the filter, not from missing privileges. Probes are chosen so that, unfiltered, they fail
//! harmlessly for another reason (bad flags, missing path, bad fd) or do nothing lasting.

use std::ffi::CStr;
use std::io;
use std::process::Command;
use std::ptr;
use std::sync::mpsc;

use pvisor_seccomp::{apply_to_all_threads, apply_to_thread, filter, Error, FilterKind};

type Outcome = Result<i64, i32>;

/// Result of a raw syscall: the return value, or errno.
fn outcome(ret: libc::c_long) -> Outcome {
    if ret == -1 {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(ret)
    }
}

/// Closes a file descriptor a probe got back, and reports success as `Ok(0)`.
fn closed(o: Outcome) -> Outcome {
    o.map(|fd| {
        // SAFETY: `fd` was just returned to this probe by the kernel and is owned by nobody else.
        unsafe { libc::close(fd as libc::c_int) };
        0
    })
}

const NO_SUCH_PATH: &CStr = c"/nonexistent/pvisor-seccomp-probe";

// ---- Probes -------------------------------------------------------------------------------
// Each returns what the kernel answered. Pointer arguments are null or point to 'static C
// strings / locals that outlive the call.

fn mount() -> Outcome {
    // SAFETY: all pointers are null or 'static C strings; a missing target fails with ENOENT.
    outcome(unsafe {
        libc::syscall(
            libc::SYS_mount,
            c"none".as_ptr(),
            NO_SUCH_PATH.as_ptr(),
            c"tmpfs".as_ptr(),
            0 as libc::c_ulong,
            ptr::null::<libc::c_void>(),
        )
    })
}

fn umount2_bad_flags() -> Outcome {
    // SAFETY: 'static C string; undefined flag bits make the kernel return EINVAL first.
    outcome(unsafe { libc::syscall(libc::SYS_umount2, c"/".as_ptr(), 0x100 as libc::c_int) })
}

fn pivot_root() -> Outcome {
    // SAFETY: 'static C strings; missing paths fail with ENOENT.
    outcome(unsafe { libc::syscall(libc::SYS_pivot_root, NO_SUCH_PATH.as_ptr(), NO_SUCH_PATH.as_ptr()) })
}

fn unshare(flags: libc::c_int) -> Outcome {
    // SAFETY: unshare takes only flags. The flags used here either fail (CLONE_NEWUSER in a
    // multi-threaded process is EINVAL) or only affect the calling probe thread.
    outcome(unsafe { libc::syscall(libc::SYS_unshare, flags) })
}

fn clone_newnet() -> Outcome {
    // CLONE_THREAD without CLONE_SIGHAND is EINVAL before any namespace is made, so without
    // the filter this creates nothing; with it, CLONE_NEWNET is what gets it refused.
    let flags = (libc::CLONE_NEWNET | libc::CLONE_THREAD) as libc::c_ulong;
    // SAFETY: the flag combination is rejected by the kernel, so no child is ever created.
    outcome(unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) })
}

fn clone_newuser() -> Outcome {
    // CLONE_NEWUSER | CLONE_FS is EINVAL before any namespace or child is made.
    let flags = (libc::CLONE_NEWUSER | libc::CLONE_FS) as libc::c_ulong;
    // SAFETY: the flag combination is rejected by the kernel, so no child is ever created.
    outcome(unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) })
}

fn clone3() -> Outcome {
    // SAFETY: a null struct of size 0 is EINVAL (size below CLONE_ARGS_SIZE_VER0).
    outcome(unsafe { libc::syscall(libc::SYS_clone3, ptr::null::<libc::c_void>(), 0usize) })
}

fn setns() -> Outcome {
    // SAFETY: fd -1 is EBADF.
    outcome(unsafe { libc::syscall(libc::SYS_setns, -1 as libc::c_int, 0 as libc::c_int) })
}

fn open_tree() -> Outcome {
    const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: 'static C string; without OPEN_TREE_CLONE this only opens an O_PATH fd of "/".
    closed(outcome(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), OPEN_TREE_CLOEXEC) }))
}

fn fsopen() -> Outcome {
    // SAFETY: 'static C string; an unknown filesystem type is ENODEV.
    closed(outcome(unsafe { libc::syscall(libc::SYS_fsopen, c"pvisor-no-such-fs".as_ptr(), 0 as libc::c_uint) }))
}

fn keyctl() -> Outcome {
    // SAFETY: an unknown operation is EOPNOTSUPP; no pointer is passed.
    outcome(unsafe { libc::syscall(libc::SYS_keyctl, 0x7fff_ffff as libc::c_int, 0usize) })
}

fn add_key() -> Outcome {
    // SAFETY: null pointers make the kernel fail with EFAULT while copying the type.
    outcome(unsafe {
        libc::syscall(
            libc::SYS_add_key,
            ptr::null::<libc::c_char>(),
            ptr::null::<libc::c_char>(),
            ptr::null::<libc::c_void>(),
            0usize,
            0 as libc::c_int,
        )
    })
}

fn bpf() -> Outcome {
    // SAFETY: an unknown command with size 0 reads nothing and is EINVAL.
    outcome(unsafe {
        libc::syscall(libc::SYS_bpf, 0x7fff as libc::c_int, ptr::null::<libc::c_void>(), 0 as libc::c_uint)
    })
}

fn init_module() -> Outcome {
    // SAFETY: null image of length 0 loads nothing (EFAULT/ENOEXEC, or ENOSYS without modules).
    outcome(unsafe { libc::syscall(libc::SYS_init_module, ptr::null::<libc::c_void>(), 0usize, c"".as_ptr()) })
}

fn kexec_load() -> Outcome {
    // SAFETY: undefined flag bits are EINVAL (ENOSYS without kexec); nothing is loaded.
    outcome(unsafe {
        libc::syscall(libc::SYS_kexec_load, 0usize, 0usize, ptr::null::<libc::c_void>(), 0xdead_0000 as libc::c_ulong)
    })
}

fn reboot_bad_magic() -> Outcome {
    // SAFETY: wrong magic numbers are EINVAL before anything happens.
    outcome(unsafe {
        libc::syscall(
            libc::SYS_reboot,
            0 as libc::c_int,
            0 as libc::c_int,
            0 as libc::c_uint,
            ptr::null::<libc::c_void>(),
        )
    })
}

fn clock_settime_monotonic() -> Outcome {
    let ts = libc::timespec { tv_sec: 1, tv_nsec: 0 };
    // SAFETY: `ts` outlives the call; CLOCK_MONOTONIC cannot be set (EINVAL).
    outcome(unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_MONOTONIC, &ts) })
}

fn perf_event_open() -> Outcome {
    // SAFETY: a null attr is EFAULT.
    closed(outcome(unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            ptr::null::<libc::c_void>(),
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            0 as libc::c_ulong,
        )
    }))
}

fn io_uring_setup() -> Outcome {
    // SAFETY: a null params pointer is EFAULT.
    closed(outcome(unsafe { libc::syscall(libc::SYS_io_uring_setup, 1 as libc::c_uint, ptr::null::<libc::c_void>()) }))
}

fn userfaultfd_bad_flags() -> Outcome {
    // SAFETY: undefined flag bits are EINVAL.
    closed(outcome(unsafe { libc::syscall(libc::SYS_userfaultfd, 0x7fff_0000 as libc::c_int) }))
}

fn name_to_handle_at() -> Outcome {
    // SAFETY: 'static C string; the path lookup fails with ENOENT before the null pointers
    // would be used.
    outcome(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            NO_SUCH_PATH.as_ptr(),
            ptr::null::<libc::c_void>(),
            ptr::null::<libc::c_int>(),
            0 as libc::c_int,
        )
    })
}

fn ioctl(request: libc::c_ulong) -> Outcome {
    // SAFETY: fd -1 is EBADF; no argument pointer is passed.
    outcome(unsafe { libc::syscall(libc::SYS_ioctl, -1 as libc::c_int, request, 0usize) })
}

fn personality(persona: libc::c_ulong) -> Outcome {
    // SAFETY: personality takes an integer. A persona that does get set only changes this
    // probe thread, and `personality_probe` restores it.
    outcome(unsafe { libc::syscall(libc::SYS_personality, persona) })
}

/// personality(ADDR_NO_RANDOMIZE), restoring the previous persona if it was set.
fn personality_no_randomize() -> Outcome {
    let result = personality(0x0040000);
    if let Ok(previous) = result {
        personality(previous as libc::c_ulong).expect("restore persona");
    }
    result
}

fn socket(domain: libc::c_int, ty: libc::c_int, protocol: libc::c_int) -> Outcome {
    // SAFETY: socket takes integers; a returned fd is closed.
    closed(outcome(unsafe { libc::syscall(libc::SYS_socket, domain, ty | libc::SOCK_CLOEXEC, protocol) }))
}

fn socketpair_unix() -> Outcome {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors and outlives the call.
    let r = outcome(unsafe {
        libc::syscall(libc::SYS_socketpair, libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    });
    if r.is_ok() {
        closed(Ok(fds[0].into())).unwrap();
        closed(Ok(fds[1].into())).unwrap();
    }
    r
}

#[cfg(target_arch = "x86_64")]
fn x32_getpid() -> Outcome {
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    // SAFETY: getpid takes no arguments; without x32 support the kernel returns ENOSYS.
    outcome(unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) })
}

fn execve() -> Outcome {
    let argv = [NO_SUCH_PATH.as_ptr(), ptr::null()];
    let envp = [ptr::null::<libc::c_char>()];
    // SAFETY: argv/envp are null-terminated arrays of 'static C strings that outlive the call;
    // the program does not exist, so nothing replaces this process (ENOENT).
    outcome(unsafe { libc::syscall(libc::SYS_execve, NO_SUCH_PATH.as_ptr(), argv.as_ptr(), envp.as_ptr()) })
}

fn execveat() -> Outcome {
    let argv = [NO_SUCH_PATH.as_ptr(), ptr::null()];
    let envp = [ptr::null::<libc::c_char>()];
    // SAFETY: as for `execve`; the path does not exist (ENOENT).
    outcome(unsafe {
        libc::syscall(
            libc::SYS_execveat,
            libc::AT_FDCWD,
            NO_SUCH_PATH.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            0 as libc::c_int,
        )
    })
}

fn ptrace_missing_pid() -> Outcome {
    // SAFETY: PTRACE_PEEKDATA on a pid that cannot exist is ESRCH; nothing is traced.
    outcome(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_PEEKDATA, libc::pid_t::MAX, 0usize, 0usize) })
}

fn process_vm_readv_bad_flags() -> Outcome {
    // SAFETY: non-zero flags are EINVAL before any iovec is read.
    outcome(unsafe {
        libc::syscall(
            libc::SYS_process_vm_readv,
            libc::getpid(),
            ptr::null::<libc::iovec>(),
            0 as libc::c_ulong,
            ptr::null::<libc::iovec>(),
            0 as libc::c_ulong,
            1 as libc::c_ulong,
        )
    })
}

fn chroot() -> Outcome {
    // SAFETY: 'static C string; a missing path is ENOENT.
    outcome(unsafe { libc::syscall(libc::SYS_chroot, NO_SUCH_PATH.as_ptr()) })
}

fn getpid() -> Outcome {
    // SAFETY: no arguments.
    outcome(unsafe { libc::syscall(libc::SYS_getpid) })
}

/// Forks a child that exits with 42 at once, and waits for it.
fn fork_and_wait() -> Outcome {
    // SAFETY: the child only calls the async-signal-safe `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the forked child at once, without running any Rust code.
        unsafe { libc::_exit(42) };
    }
    if pid < 0 {
        return outcome(-1);
    }
    let mut status = 0;
    // SAFETY: `status` outlives the call; `pid` is our child.
    let waited = outcome(unsafe { libc::waitpid(pid, &mut status, 0) }.into())?;
    assert_eq!(waited, i64::from(pid));
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    Ok(libc::WEXITSTATUS(status).into())
}

/// Writes, reopens and reads back a temporary file.
fn temp_file_round_trip() -> Outcome {
    let path =
        std::env::temp_dir().join(format!("pvisor-seccomp-{}-{:?}", std::process::id(), std::thread::current().id()));
    let io = (|| {
        std::fs::write(&path, b"seccomp")?;
        let back = std::fs::read(&path)?;
        std::fs::remove_file(&path)?;
        Ok::<_, io::Error>(back)
    })();
    match io {
        Ok(back) if back == b"seccomp" => Ok(0),
        Ok(_) => Err(0),
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
    }
}

/// Spawns and joins a thread (glibc gets ENOSYS from clone3 and must fall back to clone).
fn spawn_thread() -> Outcome {
    std::thread::spawn(|| 7).join().map(|v| v - 7).map_err(|_| 0)
}

fn no_new_privs() -> Outcome {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer.
    outcome(unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) }.into())
}

// ---- Harness ------------------------------------------------------------------------------

type Probe = fn() -> Outcome;

/// Runs `probes` in a fresh thread, with `kind`'s filter installed first if given.
fn run_in_thread(kind: Option<FilterKind>, probes: &[(&'static str, Probe)]) -> Vec<Outcome> {
    let prog = kind.map(|k| filter(k).expect("filter compiles"));
    let probes = probes.to_vec();
    std::thread::spawn(move || {
        if let Some(prog) = prog {
            apply_to_thread(&prog).expect("install filter");
        }
        probes.iter().map(|(_, probe)| probe()).collect()
    })
    .join()
    .expect("probe thread panicked")
}

fn show(o: &Outcome) -> String {
    match o {
        Ok(v) => format!("Ok({v})"),
        Err(e) => format!("Err({})", io::Error::from_raw_os_error(*e)),
    }
}

/// Each probe must fail with its errno under the filter, and not with EPERM nor that errno
/// without it.
fn assert_refused(kind: FilterKind, probes: &[(&'static str, Probe, i32)]) {
    let list: Vec<(&'static str, Probe)> = probes.iter().map(|(n, p, _)| (*n, *p)).collect();
    let filtered = run_in_thread(Some(kind), &list);
    let unfiltered = run_in_thread(None, &list);
    let mut failures = Vec::new();
    for (((name, _, errno), with), without) in probes.iter().zip(&filtered).zip(&unfiltered) {
        let ok = *with == Err(*errno) && *without != Err(*errno) && *without != Err(libc::EPERM);
        let line = format!(
            "{kind} {name}: filtered {}, unfiltered {} (want filtered Err({}))",
            show(with),
            show(without),
            io::Error::from_raw_os_error(*errno)
        );
        println!("{line}");
        if !ok {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Each probe must give the same answer with and without the filter, and that answer must
/// not be EPERM.
fn assert_unaffected(kind: FilterKind, probes: &[(&'static str, Probe)]) {
    let filtered = run_in_thread(Some(kind), probes);
    let unfiltered = run_in_thread(None, probes);
    let mut failures = Vec::new();
    for (((name, _), with), without) in probes.iter().zip(&filtered).zip(&unfiltered) {
        let line = format!("{kind} {name}: filtered {}, unfiltered {}", show(with), show(without));
        println!("{line}");
        if with != without || *with == Err(libc::EPERM) {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

const EPERM: i32 = libc::EPERM;

/// Refused by both filters.
fn common_refusals() -> Vec<(&'static str, Probe, i32)> {
    vec![
        ("mount", mount, EPERM),
        ("umount2", umount2_bad_flags, EPERM),
        ("pivot_root", pivot_root, EPERM),
        ("unshare(CLONE_NEWUSER)", || unshare(libc::CLONE_NEWUSER), EPERM),
        ("clone(CLONE_NEWNET)", clone_newnet, EPERM),
        ("clone(CLONE_NEWUSER)", clone_newuser, EPERM),
        ("clone3", clone3, libc::ENOSYS),
        ("setns", setns, EPERM),
        ("open_tree", open_tree, EPERM),
        ("fsopen", fsopen, EPERM),
        ("keyctl", keyctl, EPERM),
        ("add_key", add_key, EPERM),
        ("bpf", bpf, EPERM),
        ("init_module", init_module, EPERM),
        ("kexec_load", kexec_load, EPERM),
        ("reboot", reboot_bad_magic, EPERM),
        ("clock_settime", clock_settime_monotonic, EPERM),
        ("perf_event_open", perf_event_open, EPERM),
        ("io_uring_setup", io_uring_setup, EPERM),
        ("userfaultfd", userfaultfd_bad_flags, EPERM),
        ("name_to_handle_at", name_to_handle_at, EPERM),
        ("ioctl(TIOCSTI)", || ioctl(libc::TIOCSTI as libc::c_ulong), EPERM),
        ("personality(ADDR_NO_RANDOMIZE)", personality_no_randomize, EPERM),
        #[cfg(target_arch = "x86_64")]
        ("x32 getpid", x32_getpid, EPERM),
    ]
}

/// Work both filters let through.
fn common_allowed() -> Vec<(&'static str, Probe)> {
    vec![
        ("getpid", || getpid().map(|pid| i64::from(pid > 0))),
        ("temp file open/write/read", temp_file_round_trip),
        ("fork + wait", fork_and_wait),
        ("thread spawn", spawn_thread),
        ("socket(AF_UNIX)", || socket(libc::AF_UNIX, libc::SOCK_STREAM, 0)),
        ("socketpair(AF_UNIX)", socketpair_unix),
        ("personality(query)", || personality(0xffff_ffff)),
        ("personality(PER_LINUX)", || personality(0)),
        ("ioctl(FIONREAD)", || ioctl(libc::FIONREAD as libc::c_ulong)),
    ]
}

#[test]
fn sandbox_filter_refuses() {
    let mut probes = common_refusals();
    probes.push(("socket(AF_VSOCK)", || socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0), EPERM));
    assert_refused(FilterKind::Sandbox, &probes);
}

#[test]
fn sandbox_filter_lets_ordinary_work_through() {
    let mut probes = common_allowed();
    probes.extend::<[(&'static str, Probe); 8]>([
        ("socket(AF_INET)", || socket(libc::AF_INET, libc::SOCK_DGRAM, 0)),
        ("socket(AF_INET6)", || socket(libc::AF_INET6, libc::SOCK_STREAM, 0)),
        ("socket(AF_NETLINK)", || socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE)),
        ("unshare(0)", || unshare(0)),
        ("unshare(CLONE_FS)", || unshare(libc::CLONE_FS)),
        ("ptrace (allowed: ESRCH)", ptrace_missing_pid),
        ("process_vm_readv (allowed: EINVAL)", process_vm_readv_bad_flags),
        ("execve (allowed: ENOENT)", execve),
    ]);
    assert_unaffected(FilterKind::Sandbox, &probes);
}

#[test]
fn worker_filter_refuses() {
    let mut probes = common_refusals();
    probes.extend::<[(&'static str, Probe, i32); 10]>([
        ("execve", execve, EPERM),
        ("execveat", execveat, EPERM),
        ("unshare(0)", || unshare(0), EPERM),
        ("ptrace", ptrace_missing_pid, EPERM),
        ("process_vm_readv", process_vm_readv_bad_flags, EPERM),
        ("chroot", chroot, EPERM),
        ("socket(AF_INET)", || socket(libc::AF_INET, libc::SOCK_DGRAM, 0), libc::EAFNOSUPPORT),
        ("socket(AF_INET6)", || socket(libc::AF_INET6, libc::SOCK_STREAM, 0), libc::EAFNOSUPPORT),
        ("socket(AF_NETLINK)", || socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE), libc::EAFNOSUPPORT),
        ("socket(AF_VSOCK)", || socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0), libc::EAFNOSUPPORT),
    ]);
    assert_refused(FilterKind::Worker, &probes);
}

#[test]
fn worker_filter_lets_ordinary_work_through() {
    assert_unaffected(FilterKind::Worker, &common_allowed());
}

#[test]
fn apply_to_thread_sets_no_new_privs_on_that_thread_only() {
    let probes: [(&'static str, Probe); 1] = [("no_new_privs", no_new_privs)];
    assert_eq!(run_in_thread(Some(FilterKind::Sandbox), &probes), vec![Ok(1)]);
    assert_eq!(run_in_thread(None, &probes), vec![Ok(0)]);
}

// ---- TSYNC, in a child process (it changes every thread of the process) ---------------------

const CHILD_ENV: &str = "PVISOR_SECCOMP_CHILD";

/// Runs `test` (an `#[ignore]`d test of this binary) alone in a new process and checks it
/// ran and passed.
fn run_child_test(test: &str) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child test {test} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

/// Whether this process was started by `run_child_test` for `test`.
fn is_child_for(test: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == test)
}

#[test]
fn apply_to_all_threads_covers_threads_that_already_exist() {
    run_child_test("tsync_child");
}

#[test]
fn apply_to_all_threads_refuses_threads_with_diverging_filters() {
    run_child_test("tsync_diverging_child");
}

/// Child of `apply_to_all_threads_covers_threads_that_already_exist`.
#[test]
#[ignore = "runs in a child process started by apply_to_all_threads_covers_threads_that_already_exist"]
fn tsync_child() {
    if !is_child_for("tsync_child") {
        println!("skipped: only meaningful in the child process");
        return;
    }
    // A thread that exists before the filter is installed, probing before and after.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (res_tx, res_rx) = mpsc::channel::<Vec<Outcome>>();
    let early = std::thread::spawn(move || {
        res_tx.send(vec![execve(), no_new_privs()]).unwrap();
        go_rx.recv().unwrap();
        res_tx
            .send(vec![
                execve(),
                no_new_privs(),
                socket(libc::AF_INET, libc::SOCK_DGRAM, 0),
                socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
                spawn_thread(),
            ])
            .unwrap();
    });
    let before = res_rx.recv().unwrap();
    assert_eq!(before, vec![Err(libc::ENOENT), Ok(0)], "before the filter");

    let prog = filter(FilterKind::Worker).unwrap();
    apply_to_all_threads(&prog).unwrap();

    go_tx.send(()).unwrap();
    let after = res_rx.recv().unwrap();
    early.join().unwrap();
    assert_eq!(
        after,
        vec![Err(libc::EPERM), Ok(1), Err(libc::EAFNOSUPPORT), Ok(0), Ok(0)],
        "pre-existing thread after the filter"
    );
    // The installing thread itself, and a thread created afterwards.
    assert_eq!(execve(), Err(libc::EPERM));
    let later = std::thread::spawn(|| (execve(), socket(libc::AF_INET6, libc::SOCK_STREAM, 0)));
    assert_eq!(later.join().unwrap(), (Err(libc::EPERM), Err(libc::EAFNOSUPPORT)));
}

/// Child of `apply_to_all_threads_refuses_threads_with_diverging_filters`.
#[test]
#[ignore = "runs in a child process started by apply_to_all_threads_refuses_threads_with_diverging_filters"]
fn tsync_diverging_child() {
    if !is_child_for("tsync_diverging_child") {
        println!("skipped: only meaningful in the child process");
        return;
    }
    // A thread with its own filter (which the installing thread lacks) blocks TSYNC.
    let (ready_tx, ready_rx) = mpsc::channel::<libc::pid_t>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let sandbox = filter(FilterKind::Sandbox).unwrap();
    let diverging = std::thread::spawn(move || {
        apply_to_thread(&sandbox).unwrap();
        // SAFETY: gettid takes no arguments.
        ready_tx.send(unsafe { libc::gettid() }).unwrap();
        done_rx.recv().unwrap();
    });
    let tid = ready_rx.recv().unwrap();

    let worker = filter(FilterKind::Worker).unwrap();
    match apply_to_all_threads(&worker) {
        Err(Error::ThreadSync { tid: t }) => assert_eq!(t, i64::from(tid)),
        other => panic!("expected ThreadSync for thread {tid}, got {other:?}"),
    }
    // Nothing was installed on this thread.
    assert_eq!(execve(), Err(libc::ENOENT));
    done_tx.send(()).unwrap();
    diverging.join().unwrap();
}

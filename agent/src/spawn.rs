//! Starting a sandbox process: argv, environment, cwd, identity, pipes.
use crate::config::{AgentConfig, ImageDefaults};
use crate::error::{AgentError, Result};
use crate::{envfile, passwd, reaper, workdir};
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// What to run, resolved against the image defaults.
#[derive(Clone, Debug, Default)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: String,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Give the process a stdin pipe instead of /dev/null.
    pub stdin_pipe: bool,
    /// More descriptors for the child: `(fd in the agent, fd number in the
    /// child)`. The agent's fds stay open (and close-on-exec) in the agent;
    /// the caller keeps them open until [`spawn`] returns.
    pub extra_fds: Vec<(RawFd, RawFd)>,
}

impl SpawnSpec {
    /// `command` through the image's shell (`bash -c`, else `/bin/sh -c`:
    /// [`crate::shell`]), or `argv` as given.
    pub fn new(cfg: &AgentConfig, command: &str, argv: &[String]) -> Result<Self> {
        let argv = if !argv.is_empty() {
            argv.to_vec()
        } else if !command.is_empty() {
            crate::shell::argv(cfg, command)
        } else {
            return Err(AgentError::InvalidArgument("command or argv is required".into()));
        };
        Ok(SpawnSpec { argv, ..Default::default() })
    }
}

pub struct Spawned {
    pub pid: i32,
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: oneshot::Receiver<i32>,
}

/// Identity a command runs as: request uid/gid, else the image's user, else root.
pub(crate) fn identity(spec: &SpawnSpec, cfg: &AgentConfig) -> Result<Option<(u32, u32)>> {
    if let Some(uid) = spec.uid {
        let gid = spec.gid.or_else(|| passwd::user_by_uid(uid).map(|u| u.gid)).unwrap_or(uid);
        return Ok(Some((uid, gid)));
    }
    if spec.gid.is_some() {
        return Err(AgentError::InvalidArgument("gid requires uid".into()));
    }
    if cfg.user.is_empty() {
        return Ok(None);
    }
    passwd::resolve_image_user(&cfg.user)
        .map(Some)
        .ok_or_else(|| AgentError::InvalidArgument(format!("image user {:?} not found", cfg.user)))
}

/// `PATH` of commands when the image sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The image's environment as a map, `PATH` defaulted.
fn image_env(cfg: &AgentConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> =
        cfg.env.iter().filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env
}

/// Where `program` is found on the `PATH` sandbox commands get (the image's,
/// else [`DEFAULT_PATH`]): the first executable regular file.
pub fn find_program(cfg: &AgentConfig, program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = image_env(cfg).remove("PATH").unwrap_or_default();
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// The environment: image env, then HOME/USER of the identity and
/// `EXECD_ENVS`, then the env file's entries ([`envfile`]), then request envs.
pub(crate) fn environment(spec: &SpawnSpec, cfg: &AgentConfig, id: Option<(u32, u32)>) -> BTreeMap<String, String> {
    let mut env = image_env(cfg);
    let uid = id.map(|(u, _)| u).unwrap_or(0);
    if let Some(u) = passwd::user_by_uid(uid) {
        env.entry("HOME".into()).or_insert(u.home);
        env.entry("USER".into()).or_insert(u.name);
    } else if uid == 0 {
        env.entry("HOME".into()).or_insert_with(|| "/root".into());
    }
    env.entry(envfile::VAR.into()).or_insert_with(|| envfile::DEFAULT_PATH.into());
    if let Some(path) = envfile::path(&env) {
        envfile::apply(&path, uid, &mut env);
    }
    env.extend(spec.envs.clone());
    env
}

/// `cwd` expanded as a process of the image's default user gets it
/// ([`workdir::resolve`]); the image's working directory when empty.
pub fn resolve_cwd(cfg: &AgentConfig, cwd: &str) -> Result<String> {
    if cwd.is_empty() {
        return Ok(cfg.workdir().to_string());
    }
    let spec = SpawnSpec::default();
    let id = identity(&spec, cfg)?;
    workdir::resolve(cwd, &environment(&spec, cfg, id))
}

/// Spawns the process in its own process group with stdin from /dev/null and
/// stdout/stderr on pipes; it is reaped by [`reaper`].
pub fn spawn(spec: &SpawnSpec, cfg: &AgentConfig) -> Result<Spawned> {
    let mut cmd = prepare(spec, cfg)?;
    cmd.stdin(if spec.stdin_pipe { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let (child, exit) = reaper::spawn_registered(|| {
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        Ok((child, pid))
    })
    .map_err(|source| AgentError::Spawn { program: spec.argv[0].clone(), source })?;
    let pid = child.id() as i32;
    let mut child = child;
    let to_pipe = |fd: std::os::fd::OwnedFd| pipe::Receiver::from_owned_fd(fd).map_err(|e| AgentError::io("pipe", e));
    let stdout = to_pipe(child.stdout.take().expect("piped").into())?;
    let stderr = to_pipe(child.stderr.take().expect("piped").into())?;
    let stdin = match child.stdin.take() {
        Some(s) => Some(pipe::Sender::from_owned_fd(s.into()).map_err(|e| AgentError::io("pipe", e))?),
        None => None,
    };
    Ok(Spawned { pid, stdin, stdout, stderr, exit })
}

/// Spawns the process on the pty whose slave end is `slave` (its stdin,
/// stdout and stderr) as the leader of a new session with that pty as its
/// controlling terminal; it is reaped by [`reaper`]. Returns its pid (also
/// its session's and process group's id) and its exit code.
pub fn spawn_on_pty(
    spec: &SpawnSpec,
    cfg: &AgentConfig,
    slave: &std::os::fd::OwnedFd,
) -> Result<(i32, oneshot::Receiver<i32>)> {
    let mut cmd = prepare(spec, cfg)?;
    let io = || slave.try_clone().map(Stdio::from).map_err(|e| AgentError::io("pty", e));
    cmd.stdin(io()?).stdout(io()?).stderr(io()?);
    // SAFETY: runs in the forked child before exec (after the identity
    // change); setsid and ioctl(TIOCSCTTY) on fd 0 are async-signal-safe
    // and touch no memory.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (pid, exit) = reaper::spawn_registered(|| {
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        Ok((pid, pid))
    })
    .map_err(|source| AgentError::Spawn { program: spec.argv[0].clone(), source })?;
    Ok((pid, exit))
}

/// The command of `spec`: argv, environment, cwd, limits, extra fds and
/// identity (stdio and grouping are the caller's).
fn prepare(spec: &SpawnSpec, cfg: &AgentConfig) -> Result<Command> {
    if spec.extra_fds.len() > 8 {
        return Err(AgentError::InvalidArgument("at most 8 extra descriptors".into()));
    }
    let id = identity(spec, cfg)?;
    let env = environment(spec, cfg, id);
    let cwd = if spec.cwd.is_empty() { cfg.workdir().to_string() } else { workdir::resolve(&spec.cwd, &env)? };
    if !std::path::Path::new(&cwd).is_dir() {
        return Err(AgentError::InvalidArgument(format!("working directory {cwd} does not exist")));
    }
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]).env_clear().envs(&env).current_dir(&cwd);
    // The agent may lock memory, runs at high priority and must survive the
    // sandbox's OOMs: commands get the usual RLIMIT_MEMLOCK and nice 0, and a
    // raised OOM score (raising needs no
    // privilege, so this works even where the host forbids lowering scores),
    // which makes them the memory cgroup's victims before the agent or worker.
    // SAFETY: the closure runs in the forked child before exec and only makes
    // setrlimit/setpriority/signal/open/write/close syscalls on a local struct
    // and a static path (all async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: COMMAND_MEMLOCK, rlim_max: COMMAND_MEMLOCK };
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
            // The agent may run at nice -20 (see the worker's harden module).
            libc::setpriority(libc::PRIO_PROCESS, 0, 0);
            // Interrupts must reach commands (and interpreter drivers) even
            // if the agent was started with SIGINT ignored.
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, COMMAND_OOM_SCORE_ADJ.as_ptr().cast(), COMMAND_OOM_SCORE_ADJ.len());
                libc::close(fd);
            }
            Ok(())
        });
    }
    if !spec.extra_fds.is_empty() {
        let fds = spec.extra_fds.clone();
        // SAFETY: the closure runs in the forked child before exec and calls
        // only fcntl/dup2/close on integers. Each source is first copied above
        // every target, so a source whose number is another's target is not
        // overwritten before it is moved; dup2 leaves the target inheritable.
        unsafe {
            cmd.pre_exec(move || {
                let floor = fds.iter().map(|&(_, to)| to).max().unwrap_or(2) + 1;
                let mut moved = [(-1, -1); 8];
                for (slot, &(from, to)) in moved.iter_mut().zip(fds.iter()) {
                    let high = libc::fcntl(from, libc::F_DUPFD_CLOEXEC, floor);
                    if high < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    *slot = (high, to);
                }
                for &(high, to) in moved.iter().filter(|(h, _)| *h >= 0) {
                    if libc::dup2(high, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(high);
                }
                Ok(())
            });
        }
    }
    if let Some((uid, gid)) = id {
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe syscalls (setgroups/setgid/setuid) on plain integers.
        unsafe {
            cmd.pre_exec(move || {
                let groups = [gid];
                // setgroups is refused when the user namespace denies it; the
                // primary gid below still applies.
                libc::setgroups(1, groups.as_ptr());
                if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Ok(cmd)
}

/// `oom_score_adj` of sandbox commands.
const COMMAND_OOM_SCORE_ADJ: &[u8] = b"500";

/// `RLIMIT_MEMLOCK` of sandbox commands (the usual default).
const COMMAND_MEMLOCK: libc::rlim_t = 8 << 20;

/// SIGKILLs the process group `pgid`, again and again until it is gone: a
/// fork bomb's members fork while the first signal is being delivered.
/// Async and thread-free on purpose: at the sandbox's pids limit the agent
/// cannot start a thread, and that is exactly when this must work.
pub async fn kill_group(pgid: i32) {
    for _ in 0..500 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        let r = unsafe { libc::kill(-pgid, libc::SIGKILL) };
        if r != 0 {
            return; // ESRCH: nobody left in the group
        }
        crate::reaper::reap_all();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// [`kill_group`] as its own task.
pub fn kill_group_bg(pgid: i32) {
    tokio::spawn(kill_group(pgid));
}

//! `pvisor-imaged`: serves one image of the pool read-only through FUSE, one process per image,
//! shared by every sandbox of that image.
//!
//! ```text
//! pvisor-imaged --pool DIR --image REF --mountpoint PATH
//!               [--id-shift N | --owner UID:GID] [--ready-fd N] [--lifeline-fd N]
//! ```
//!
//! * `--pool DIR`: the image pool; `--image REF`: a name, id or id prefix in it.
//! * `--mountpoint PATH`: an existing directory to mount the image on.
//! * `--id-shift N`: show uid/gid `u` as `u + N` (root broker; `N + 65536` must fit in 32
//!   bits). `--owner UID:GID`: show every file as owned by `UID:GID` (non-root broker).
//!   Default: `--id-shift 100000` as root, `--owner` the server's own euid:egid otherwise.
//! * `--ready-fd N`: once the mount is live and the server jailed, `ready\n` is written to fd
//!   `N`, which is then closed.
//! * `--lifeline-fd N`: the server exits with status 0 when fd `N` reaches EOF (whoever holds
//!   the write end died or closed it).
//!
//! Sequence: open the pool and the image view (every pack file) → mount (mount(2) as root,
//! `fusermount3` otherwise) and complete the FUSE handshake → jail ([`super::jail`]) →
//! `ready` → serve until unmounted (exit 0) or the lifeline closes (exit 0). Errors: one line
//! on stderr (`pvisor-imaged: ...`) and exit status 2.
//!
//! Unmounting: the jailed server cannot unmount. When it exits because of the lifeline, the
//! mount stays behind, disconnected (every access fails with `ENOTCONN`), and the broker removes
//! it with `umount2(PATH, MNT_DETACH)`. When the broker unmounts first (also with
//! `MNT_DETACH`), the server exits 0 once the kernel drops the file system, i.e. once no
//! overlay uses it as a layer any more.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use fuser::{Session, SessionACL};

use super::attr::IdMap;
use super::error::{Error, Result};
use super::fs::{ImageFs, OpenMode};
use super::mount::{fsname, mount_config, MountSpec, DEFAULT_THREADS};
use super::{fusermount, jail, pipes, prefetch};
use crate::{Options, Pool, DEFAULT_ID_SHIFT, ID_RANGE};

/// The usage line.
pub const USAGE: &str = "usage: pvisor-imaged --pool DIR --image REF --mountpoint PATH \
                         [--id-shift N | --owner UID:GID] [--ready-fd N] [--lifeline-fd N]";

/// Exit status of every error.
pub const EXIT_ERROR: u8 = 2;

/// The command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub pool: PathBuf,
    pub image: String,
    pub mountpoint: PathBuf,
    /// None: the default for the server's euid (see the module docs).
    pub ids: Option<IdMap>,
    pub ready_fd: Option<RawFd>,
    pub lifeline_fd: Option<RawFd>,
}

impl Args {
    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Args> {
        let usage = |what: String| Error::Usage(format!("{what}\n{USAGE}"));
        let (mut pool, mut image, mut mountpoint, mut ids) = (None, None, None, None);
        let (mut ready_fd, mut lifeline_fd) = (None, None);
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let flag =
                flag.to_str().map(str::to_owned).ok_or_else(|| usage(format!("unexpected argument {flag:?}")))?;
            let value = args.next().ok_or_else(|| usage(format!("{flag} needs a value")))?;
            let text = || value.to_str().ok_or_else(|| usage(format!("{flag}: not UTF-8")));
            let number = |v: &str| v.parse::<u32>().map_err(|_| usage(format!("{flag}: not a number: {v:?}")));
            let fd = |v: &str| v.parse::<RawFd>().map_err(|_| usage(format!("{flag}: not an fd: {v:?}")));
            let slot_taken = match flag.as_str() {
                "--pool" => pool.replace(PathBuf::from(&value)).is_some(),
                "--image" => image.replace(text()?.to_owned()).is_some(),
                "--mountpoint" => mountpoint.replace(PathBuf::from(&value)).is_some(),
                "--id-shift" => {
                    let n = number(text()?)?;
                    if n.checked_add(ID_RANGE).is_none() {
                        return Err(usage(format!("--id-shift {n} leaves no room for {ID_RANGE} ids")));
                    }
                    ids.replace(IdMap::Shift(n)).is_some()
                }
                "--owner" => {
                    let (u, g) = text()?.split_once(':').ok_or_else(|| usage("--owner wants UID:GID".into()))?;
                    ids.replace(IdMap::Owner(number(u)?, number(g)?)).is_some()
                }
                "--ready-fd" => ready_fd.replace(fd(text()?)?).is_some(),
                "--lifeline-fd" => lifeline_fd.replace(fd(text()?)?).is_some(),
                _ => return Err(usage(format!("unknown option {flag}"))),
            };
            if slot_taken {
                let what = if matches!(flag.as_str(), "--id-shift" | "--owner") { "--id-shift/--owner" } else { &flag };
                return Err(usage(format!("{what} given twice")));
            }
        }
        if ready_fd.is_some() && ready_fd == lifeline_fd {
            return Err(usage("--ready-fd and --lifeline-fd must differ".into()));
        }
        let missing = |flag: &str| usage(format!("{flag} is required"));
        Ok(Args {
            pool: pool.ok_or_else(|| missing("--pool"))?,
            image: image.ok_or_else(|| missing("--image"))?,
            mountpoint: mountpoint.ok_or_else(|| missing("--mountpoint"))?,
            ids,
            ready_fd,
            lifeline_fd,
        })
    }
}

/// The id mapping used without `--id-shift`/`--owner`.
pub fn default_ids() -> IdMap {
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    if uid.is_root() {
        IdMap::Shift(DEFAULT_ID_SHIFT)
    } else {
        IdMap::Owner(uid.as_raw(), gid.as_raw())
    }
}

/// Mounts, jails and serves; returns when the file system is unmounted (the lifeline ends the
/// process directly).
pub fn run(args: Args) -> Result<()> {
    let ready = args.ready_fd.map(|fd| pipes::take_fd("ready-fd", fd)).transpose()?;
    let lifeline = args.lifeline_fd.map(|fd| pipes::take_fd("lifeline-fd", fd)).transpose()?;
    let ids = args.ids.unwrap_or_else(default_ids);

    let image_err =
        |source| Error::Image { image: args.image.clone(), pool: args.pool.clone(), source: Box::new(source) };
    // Opening a pool creates it when missing; a server must not conjure an empty one.
    if !args.pool.is_dir() {
        return Err(Error::NoPool(args.pool.clone()));
    }
    let pool = Pool::open_with(&args.pool, Options::default()).map_err(image_err)?;
    let record = pool.resolve(&args.image).map_err(image_err)?;
    let view = pool.view(&record).map_err(image_err)?;
    drop(pool);

    let root = nix::unistd::geteuid().is_root();
    let config = mount_config(&MountSpec { image_id: &record.id, allow_other: root, threads: DEFAULT_THREADS });
    let fs = ImageFs::new(view, ids, OpenMode::NoOpen);
    let (prefetch_slot, prefetch_view) = fs.prefetch_parts();
    let mount_err = |source| Error::Mount { mountpoint: args.mountpoint.clone(), source };
    let session = if root {
        Session::new(fs, &args.mountpoint, &config).map_err(mount_err)?
    } else {
        let options = format!("ro,nosuid,nodev,default_permissions,fsname={},subtype=pvisor", fsname(&record.id));
        let fd = fusermount::mount(&args.mountpoint, &options).map_err(mount_err)?;
        Session::from_fd(fs, fd, SessionACL::Owner, config).map_err(mount_err)?
    };

    jail::jail()?;
    // After the jail: capabilities are per thread, so a thread started now
    // has none (and seccomp applies to it as to every thread).
    prefetch::start(&prefetch_slot, prefetch_view, session.notifier()).map_err(Error::Serve)?;
    if let Some(fd) = lifeline {
        pipes::watch_lifeline(fd)?;
    }
    if let Some(fd) = ready {
        pipes::signal_ready(fd)?;
    }
    session.run().map_err(Error::Serve)
}

/// `main` of `pvisor-imaged`: runs and turns an error into a message and [`EXIT_ERROR`].
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    match Args::parse(args).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvisor-imaged: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args> {
        Args::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_the_contract() {
        let a = parse(&[
            "--pool",
            "/p",
            "--image",
            "busybox:latest",
            "--mountpoint",
            "/m",
            "--id-shift",
            "100000",
            "--ready-fd",
            "5",
            "--lifeline-fd",
            "6",
        ])
        .unwrap();
        assert_eq!(
            a,
            Args {
                pool: "/p".into(),
                image: "busybox:latest".into(),
                mountpoint: "/m".into(),
                ids: Some(IdMap::Shift(100_000)),
                ready_fd: Some(5),
                lifeline_fd: Some(6),
            }
        );
        let a = parse(&["--mountpoint", "/m", "--owner", "1000:1001", "--image", "x", "--pool", "/p"]).unwrap();
        assert_eq!(a.ids, Some(IdMap::Owner(1000, 1001)));
        assert_eq!((a.ready_fd, a.lifeline_fd), (None, None));
    }

    #[test]
    fn refuses_bad_command_lines() {
        let base = ["--pool", "/p", "--image", "x", "--mountpoint", "/m"];
        let with = |extra: &[&str]| parse(&[&base[..], extra].concat()).unwrap_err().to_string();
        assert!(with(&["--id-shift", "1", "--owner", "1:1"]).contains("given twice"));
        assert!(with(&["--id-shift", "4294967295"]).contains("no room"));
        assert!(with(&["--owner", "1000"]).contains("UID:GID"));
        assert!(with(&["--ready-fd", "x"]).contains("not an fd"));
        assert!(with(&["--bogus", "1"]).contains("unknown option"));
        assert!(with(&["--ready-fd", "5", "--lifeline-fd", "5"]).contains("must differ"));
        assert!(with(&["--ready-fd"]).contains("needs a value"));
        assert!(parse(&["--pool", "/p", "--image", "x"]).unwrap_err().to_string().contains("--mountpoint is required"));
        assert_eq!(parse(&base).unwrap().ids, None);
    }
}

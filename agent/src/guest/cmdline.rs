//! pvisor's keys on the guest kernel's command line.
//!
//! The worker (the VMM) writes the command line, so it is the agent's boot
//! configuration in the vm backend: which disk holds the image, which the
//! scratch, the vsock port to listen on, the hostname. The kernel does not
//! hand dotted keys to init (it takes them for module parameters), so the
//! agent reads `/proc/cmdline` itself.
//!
//! Keys the agent does not know under `pvisor.` are an error, not ignored: the
//! worker and the agent ship together, and a renamed key must fail the boot
//! with its name on the console rather than fall back to a default silently.
use super::error::GuestError;
use std::path::PathBuf;

/// The command-line prefix of pvisor's keys.
const PREFIX: &str = "pvisor.";

/// Longest hostname the kernel takes (`__NEW_UTS_LEN`).
const MAX_HOSTNAME: usize = 64;

/// The agent's boot configuration, from `pvisor.*` keys; each has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestCmdline {
    /// `pvisor.root`: the read-only erofs disk with the image (default `/dev/vda`).
    pub root: PathBuf,
    /// `pvisor.scratch`: the writable ext4 disk for the overlay's upper (default `/dev/vdb`).
    pub scratch: PathBuf,
    /// `pvisor.port`: the vsock port the agent listens on (default 1024).
    pub port: u32,
    /// `pvisor.hostname`: the sandbox's hostname (default `sandbox`).
    pub hostname: String,
    /// `pvisor.selftest=1`: check the root filesystem, report on the console,
    /// power off (for tests without vsock).
    pub selftest: bool,
    /// `pvisor.net=1`: the guest has a virtio-net device to the sandbox's
    /// network process: configure `eth0`, the default route, and write
    /// `/etc/resolv.conf` (default off: loopback only).
    pub net: bool,
}

impl Default for GuestCmdline {
    fn default() -> Self {
        GuestCmdline {
            root: PathBuf::from("/dev/vda"),
            scratch: PathBuf::from("/dev/vdb"),
            port: 1024,
            hostname: "sandbox".into(),
            selftest: false,
            net: false,
        }
    }
}

impl GuestCmdline {
    /// Reads and parses `/proc/cmdline` (proc must be mounted).
    pub fn from_proc() -> Result<Self, GuestError> {
        let text = std::fs::read_to_string("/proc/cmdline").map_err(|e| GuestError::io("read /proc/cmdline", e))?;
        Self::parse(&text)
    }

    /// Parses a kernel command line; words other than `pvisor.*` are skipped.
    pub fn parse(text: &str) -> Result<Self, GuestError> {
        let mut cfg = GuestCmdline::default();
        for word in words(text) {
            let Some(rest) = word.strip_prefix(PREFIX) else { continue };
            let (key, value) = rest.split_once('=').unwrap_or((rest, ""));
            match key {
                "root" => cfg.root = device(key, value)?,
                "scratch" => cfg.scratch = device(key, value)?,
                "port" => cfg.port = port(value)?,
                "hostname" => cfg.hostname = hostname(value)?,
                "selftest" => cfg.selftest = flag(key, value)?,
                "net" => cfg.net = flag(key, value)?,
                _ => return Err(GuestError::Cmdline { key: word.to_string(), reason: "unknown key".into() }),
            }
        }
        if cfg.root == cfg.scratch {
            return Err(bad("root", "the same disk as pvisor.scratch"));
        }
        Ok(cfg)
    }
}

/// Splits a command line into words the way the kernel does: on whitespace,
/// except inside double quotes, which are removed.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut in_word = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

fn bad(key: &str, reason: &str) -> GuestError {
    GuestError::Cmdline { key: format!("{PREFIX}{key}"), reason: reason.into() }
}

/// A block device: an absolute path under /dev with no `..`.
fn device(key: &str, value: &str) -> Result<PathBuf, GuestError> {
    let ok = value.starts_with("/dev/")
        && value.len() > "/dev/".len()
        && value.split('/').all(|c| c != ".." && c != ".")
        && !value.ends_with('/');
    if ok {
        Ok(PathBuf::from(value))
    } else {
        Err(bad(key, &format!("{value:?} is not a device path under /dev")))
    }
}

fn port(value: &str) -> Result<u32, GuestError> {
    match value.parse::<u32>() {
        // u32::MAX is VMADDR_PORT_ANY, not a port one can be reached at.
        Ok(p) if p != 0 && p != u32::MAX => Ok(p),
        _ => Err(bad("port", &format!("{value:?} is not a vsock port"))),
    }
}

/// A hostname as `sethostname` and resolvers take it: 1–64 bytes of letters,
/// digits, `-` and `.`.
fn hostname(value: &str) -> Result<String, GuestError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_HOSTNAME
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(value.to_string())
    } else {
        Err(bad("hostname", &format!("{value:?} is not a hostname")))
    }
}

/// `key`, `key=1` and `key=0` (a bare key means on).
fn flag(key: &str, value: &str) -> Result<bool, GuestError> {
    match value {
        "" | "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(bad(key, &format!("{value:?} is not 0 or 1"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(e: GuestError) -> String {
        match e {
            GuestError::Cmdline { key, .. } => key,
            other => panic!("not a cmdline error: {other}"),
        }
    }

    #[test]
    fn defaults_without_pvisor_keys() {
        let c = GuestCmdline::parse("console=ttyS0 reboot=t panic=-1 quiet\n").unwrap();
        assert_eq!(c, GuestCmdline::default());
        assert_eq!(c.root, PathBuf::from("/dev/vda"));
        assert_eq!(c.scratch, PathBuf::from("/dev/vdb"));
        assert_eq!(c.port, 1024);
        assert_eq!(c.hostname, "sandbox");
        assert!(!c.selftest);
        assert!(!c.net);
    }

    #[test]
    fn every_key() {
        let c = GuestCmdline::parse(
            "console=ttyS0 pvisor.root=/dev/vdc pvisor.scratch=/dev/vdd pvisor.port=5000 \
             pvisor.hostname=box-1.local pvisor.selftest=1 pvisor.net=1",
        )
        .unwrap();
        assert!(c.net);
        assert_eq!(c.root, PathBuf::from("/dev/vdc"));
        assert_eq!(c.scratch, PathBuf::from("/dev/vdd"));
        assert_eq!(c.port, 5000);
        assert_eq!(c.hostname, "box-1.local");
        assert!(c.selftest);
    }

    #[test]
    fn bare_flag_and_zero() {
        assert!(GuestCmdline::parse("pvisor.selftest").unwrap().selftest);
        assert!(!GuestCmdline::parse("pvisor.selftest=0").unwrap().selftest);
        assert_eq!(key_of(GuestCmdline::parse("pvisor.selftest=yes").unwrap_err()), "pvisor.selftest");
        assert!(!GuestCmdline::parse("pvisor.net=0").unwrap().net);
        assert_eq!(key_of(GuestCmdline::parse("pvisor.net=2").unwrap_err()), "pvisor.net");
    }

    #[test]
    fn last_value_wins() {
        let c = GuestCmdline::parse("pvisor.port=5 pvisor.port=6").unwrap();
        assert_eq!(c.port, 6);
    }

    #[test]
    fn quotes_group_and_vanish() {
        assert_eq!(words("a \"b c\" d=\"e f\"  g"), ["a", "b c", "d=e f", "g"]);
        assert_eq!(words("  \t\n"), Vec::<String>::new());
        let c = GuestCmdline::parse("x=\"pvisor.port=9 y\" \"pvisor.hostname=h\"").unwrap();
        // The first word is `x=pvisor.port=9 y`: not a pvisor key.
        assert_eq!(c.port, 1024);
        assert_eq!(c.hostname, "h");
    }

    #[test]
    fn unknown_key_is_an_error() {
        let e = GuestCmdline::parse("console=ttyS0 pvisor.rootfs=/dev/vda").unwrap_err();
        assert_eq!(key_of(e), "pvisor.rootfs=/dev/vda");
    }

    #[test]
    fn bad_devices() {
        for v in ["vda", "/dev/", "/dev/../etc/passwd", "/sys/vda", "", "/dev/vda/", "/dev/./vda"] {
            let e = GuestCmdline::parse(&format!("pvisor.root={v}")).unwrap_err();
            assert_eq!(key_of(e), "pvisor.root", "{v:?}");
        }
        let e = GuestCmdline::parse("pvisor.scratch=/dev/vda").unwrap_err();
        assert_eq!(key_of(e), "pvisor.root", "root and scratch on one disk");
    }

    #[test]
    fn bad_ports() {
        for v in ["", "0", "-1", "4294967295", "4294967296", "12a"] {
            let e = GuestCmdline::parse(&format!("pvisor.port={v}")).unwrap_err();
            assert_eq!(key_of(e), "pvisor.port", "{v:?}");
        }
        assert_eq!(GuestCmdline::parse("pvisor.port=4294967294").unwrap().port, u32::MAX - 1);
    }

    #[test]
    fn bad_hostnames() {
        let long = "a".repeat(65);
        for v in ["", "a b", "a/b", "a_b", long.as_str(), "é"] {
            let e = GuestCmdline::parse(&format!("\"pvisor.hostname={v}\"")).unwrap_err();
            assert_eq!(key_of(e), "pvisor.hostname", "{v:?}");
        }
        assert_eq!(GuestCmdline::parse(&format!("pvisor.hostname={}", "a".repeat(64))).unwrap().hostname.len(), 64);
    }
}

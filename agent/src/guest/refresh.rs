//! A guest's hygiene on the worker's request (`Agent.Refresh`): the clock
//! stepped to the host's time, fresh entropy credited and the kernel's
//! random generator reseeded, the hostname set. A fresh boot gets it once; a
//! guest restored from a snapshot needs it, since it resumes with the
//! source's clock (behind by the time since the snapshot), the source's
//! random state (two restores would draw the same numbers) and the source's
//! hostname.
//!
//! Those need `CAP_SYS_TIME` and `CAP_SYS_ADMIN`, and system calls the
//! sandbox's seccomp filter refuses, which the agent gives up at boot
//! ([`super::init`]). So [`start`] runs one thread before the drop that
//! keeps them; it takes requests only from this process ([`apply`]) and
//! does these three things only.
use super::error::GuestError;
use pvisor_proto::agent::RefreshRequest;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Job = (RefreshRequest, Sender<Result<(), String>>);

static REFRESHER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// Most entropy bytes one request credits.
pub const MAX_ENTROPY: usize = 256;

/// Starts the privileged thread. Called by the guest's init before it drops
/// its privileges; outside a guest it is never started and [`apply`] refuses.
pub fn start() -> std::io::Result<()> {
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new().name("refresh".into()).spawn(move || {
        for (req, reply) in rx {
            let _ = reply.send(run(&req).map_err(|e| e.to_string()));
        }
    })?;
    let _ = REFRESHER.set(Mutex::new(tx));
    Ok(())
}

/// Runs `req` on the privileged thread (blocking). `Err(None)`: not a vm guest.
pub fn apply(req: RefreshRequest) -> Result<(), Option<String>> {
    let tx = REFRESHER.get().ok_or(None)?.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (reply_tx, reply_rx) = channel();
    tx.send((req, reply_tx)).map_err(|_| Some("the refresh thread is gone".to_string()))?;
    reply_rx.recv().map_err(|_| Some("the refresh thread is gone".to_string()))?.map_err(Some)
}

fn run(req: &RefreshRequest) -> Result<(), GuestError> {
    if req.unix_time_ns > 0 {
        set_clock(req.unix_time_ns)?;
    }
    if !req.entropy.is_empty() {
        add_entropy(&req.entropy[..req.entropy.len().min(MAX_ENTROPY)])?;
    }
    if !req.hostname.is_empty() {
        nix::unistd::sethostname(&req.hostname).map_err(|e| GuestError::sys("sethostname", e))?;
        super::boot::write_etc(&req.hostname, Path::new("/sys/class/net").join(pvisor_net::plan::IFACE).exists());
    }
    Ok(())
}

fn set_clock(unix_ns: i64) -> Result<(), GuestError> {
    let ts = libc::timespec { tv_sec: unix_ns.div_euclid(1_000_000_000), tv_nsec: unix_ns.rem_euclid(1_000_000_000) };
    // SAFETY: clock_settime reads the timespec we own; no memory is written.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(GuestError::io("clock_settime", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Credits `bytes` to the input pool (`RNDADDENTROPY`, 8 bits a byte: they
/// come from the host's getrandom) and reseeds the generator from it now
/// (`RNDRESEEDCRNG`), so the next read of any clone differs from its siblings'.
fn add_entropy(bytes: &[u8]) -> Result<(), GuestError> {
    let f = OpenOptions::new().write(true).open("/dev/urandom").map_err(|e| GuestError::io("open /dev/urandom", e))?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + bytes.len().div_ceil(4) * 4);
    info.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    info.extend_from_slice(bytes);
    info.resize(8 + bytes.len().div_ceil(4) * 4, 0);
    // SAFETY: `info` is a whole rand_pool_info of buf_size bytes, alive for the call; the kernel only reads it.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } != 0 {
        return Err(GuestError::io("ioctl RNDADDENTROPY", std::io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) } != 0 {
        return Err(GuestError::io("ioctl RNDRESEEDCRNG", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_guest_nothing_is_applied() {
        assert_eq!(apply(RefreshRequest { unix_time_ns: 1, ..Default::default() }), Err(None));
    }

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // _IOW('R', 3, int[2]) and _IO('R', 7) as <linux/random.h> computes them.
        let ioc = |dir: libc::c_ulong, nr: libc::c_ulong, size: libc::c_ulong| {
            (dir << 30) | (size << 16) | (libc::c_ulong::from(b'R') << 8) | nr
        };
        assert_eq!(RNDADDENTROPY, ioc(1, 3, 8));
        assert_eq!(RNDRESEEDCRNG, ioc(0, 7, 0));
    }
}

//! The sandbox's link: one Ethernet frame per read()/write(). True of a tap
//! (IFF_TAP | IFF_NO_PI, ns backend) and of a SOCK_SEQPACKET socket (vm
//! backend) alike, so one type serves both. Non-blocking; a frame the link
//! cannot take right now is dropped (TCP retransmits, as on a real wire).
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Largest frame netd reads: a 65520-byte MTU tap's IP packet plus the
/// Ethernet header, rounded up.
pub const MAX_FRAME: usize = 65536 + 64;
/// Socket buffer asked for on a SOCK_SEQPACKET link (the kernel caps it at
/// net.core.[rw]mem_max).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

pub struct Link {
    fd: OwnedFd,
}

impl Link {
    /// Takes the link's fd and makes it non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Link> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on an fd we own; no memory is passed.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: the option value is a c_int that outlives the call, its
            // size is passed; on a tap this fails with ENOTSOCK, which is fine.
            unsafe {
                libc::setsockopt(
                    raw,
                    libc::SOL_SOCKET,
                    opt,
                    (&SOCKET_BUFFER as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Ok(Link { fd })
    }

    /// Reads one frame into `buf`: `Ok(None)` when none is waiting, `Ok(Some(0))`
    /// when the link's other end is gone.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: buf is valid for writes of buf.len() bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// Writes one frame; `Ok(false)` when the link is full and it was dropped.
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        loop {
            // SAFETY: frame is valid for reads of frame.len() bytes.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            if n >= 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

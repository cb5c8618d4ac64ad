//! ICMP echo from the sandbox, through an unprivileged ping socket
//! (SOCK_DGRAM/IPPROTO_ICMP) where the host allows one for netd's group
//! (net.ipv4.ping_group_range); elsewhere echo requests are dropped.
//!
//! The kernel gives the socket an ident of its own, so netd remembers which
//! sandbox ident each (destination, sequence) belongs to and restores it on
//! the reply.
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Echo requests awaiting a reply, at most (older ones are forgotten first).
const MAX_OUTSTANDING: usize = 1024;
/// A reply later than this is dropped.
const REPLY_WITHIN: Duration = Duration::from_secs(10);

struct Outstanding {
    ident: u16,
    guest: Ipv4Addr,
    at: Instant,
}

/// An echo reply for the sandbox.
pub struct Reply<'a> {
    pub from: Ipv4Addr,
    pub to: Ipv4Addr,
    pub ident: u16,
    pub seq: u16,
    pub data: &'a [u8],
}

pub struct Ping {
    fd: OwnedFd,
    outstanding: HashMap<(Ipv4Addr, u16), Outstanding>,
    buf: Vec<u8>,
}

impl Ping {
    /// A ping socket, or the reason there is none (EACCES: the host's
    /// ping_group_range leaves netd's group out).
    pub fn open() -> io::Result<Ping> {
        // SAFETY: socket with integer arguments; the fd is checked below.
        let fd = unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, libc::IPPROTO_ICMP)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Ping { fd, outstanding: HashMap::new(), buf: vec![0; 65536] })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends the sandbox's echo request (`guest` → `dst`); a full socket drops it.
    pub fn send(&mut self, guest: Ipv4Addr, dst: Ipv4Addr, ident: u16, seq: u16, data: &[u8], now: Instant) {
        if self.outstanding.len() >= MAX_OUTSTANDING {
            self.outstanding.retain(|_, o| now.duration_since(o.at) < REPLY_WITHIN);
            if self.outstanding.len() >= MAX_OUTSTANDING {
                return;
            }
        }
        let mut msg = Vec::with_capacity(8 + data.len());
        // Type 8 (echo request), code 0, checksum and ident filled by the kernel.
        msg.extend_from_slice(&[8, 0, 0, 0, 0, 0]);
        msg.extend_from_slice(&seq.to_be_bytes());
        msg.extend_from_slice(data);
        let addr = sockaddr(SocketAddrV4::new(dst, 0));
        // SAFETY: msg and addr are valid for the lengths passed.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n >= 0 {
            self.outstanding.insert((dst, seq), Outstanding { ident, guest, at: now });
        }
    }

    /// Reads the replies that arrived, each handed to `reply`.
    pub fn replies(&mut self, now: Instant, mut reply: impl FnMut(Reply<'_>)) {
        loop {
            let mut from: libc::sockaddr_in = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: buf and from are valid for writes of the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_in).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            let msg = &self.buf[..n as usize];
            if msg.len() < 8 || msg[0] != 0 {
                continue;
            }
            let src = Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr));
            let seq = u16::from_be_bytes([msg[6], msg[7]]);
            let Some(o) = self.outstanding.remove(&(src, seq)) else { continue };
            if now.duration_since(o.at) < REPLY_WITHIN {
                reply(Reply { from: src, to: o.guest, ident: o.ident, seq, data: &msg[8..] });
            }
        }
    }
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

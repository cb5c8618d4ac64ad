//! The device's wire: the `SOCK_SEQPACKET` socket to netd, non-blocking
//! `recv`/`send` of whole frames, and an epoll set of its own (the device's
//! event source) whose interest follows what the device can take.
//!
//! The set is level-triggered, so the socket is only in it for the
//! directions the device can act on: readable while no rx frame waits for
//! guest buffers, writable while a tx frame waits for room. A peer that
//! hangs up (or errors) takes the link down and the socket out of the set,
//! so a dead netd cannot make the device thread spin.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::Error;

/// What a receive produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recv {
    /// A frame of this many bytes; more than the buffer held when it was
    /// larger (the rest is discarded by the socket).
    Frame(usize),
    WouldBlock,
    Closed,
}

/// What a send did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Send {
    Sent,
    /// The socket can never take a frame this large (EMSGSIZE).
    TooLarge,
    WouldBlock,
    Closed,
}

pub(super) struct Link {
    fd: OwnedFd,
    epoll: Epoll,
    interest: EventSet,
    up: bool,
}

impl Link {
    /// Takes `fd`, which must be a `SOCK_SEQPACKET` socket.
    pub fn new(fd: OwnedFd) -> Result<Self, Error> {
        let kind = socket_type(fd.as_raw_fd()).map_err(Error::Link)?;
        if kind != libc::SOCK_SEQPACKET {
            return Err(Error::NotSeqpacket(kind));
        }
        let epoll = Epoll::new().map_err(Error::Setup)?;
        epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, 0)).map_err(Error::Setup)?;
        Ok(Self { fd, epoll, interest: EventSet::IN, up: true })
    }

    /// The epoll fd the transport's loop waits on.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Whether netd is still there.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Collects the set's events; a hang-up or error takes the link down.
    pub fn poll(&mut self) {
        if !self.up {
            return;
        }
        let mut events = [EpollEvent::default(); 4];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("virtio-net: epoll_wait: {e}");
                0
            }
        };
        let broken = EventSet::HANG_UP | EventSet::ERROR;
        if events[..n].iter().any(|e| e.event_set().intersects(broken)) {
            self.down("the peer hung up");
        }
    }

    /// What the set watches the socket for.
    pub fn interest(&self) -> EventSet {
        self.interest
    }

    /// Makes the set watch the socket for `wanted` (IN and/or OUT).
    pub fn set_interest(&mut self, wanted: EventSet) {
        if !self.up || wanted == self.interest {
            return;
        }
        let event = EpollEvent::new(wanted, 0);
        match self.epoll.ctl(ControlOperation::Modify, self.fd.as_raw_fd(), event) {
            Ok(()) => self.interest = wanted,
            Err(e) => {
                tracing::warn!("virtio-net: epoll_ctl: {e}");
                self.down("epoll_ctl failed");
            }
        }
    }

    /// Receives one frame into `buf` without blocking.
    pub fn recv(&mut self, buf: &mut [u8]) -> Recv {
        if !self.up {
            return Recv::Closed;
        }
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // duration of the call; the fd is owned by `self`. MSG_TRUNC makes
        // the kernel return the frame's real length (it writes at most
        // `buf.len()` bytes).
        let n = unsafe {
            libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC)
        };
        match n {
            // netd never sends an empty frame: 0 is the end of the stream.
            0 => {
                self.down("end of stream");
                Recv::Closed
            }
            n if n > 0 => Recv::Frame(n as usize),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => Recv::WouldBlock,
                e if e.kind() == io::ErrorKind::Interrupted => Recv::WouldBlock,
                e => {
                    tracing::warn!("virtio-net: recv: {e}");
                    self.down("recv failed");
                    Recv::Closed
                }
            },
        }
    }

    /// Sends `frame` as one message without blocking.
    pub fn send(&mut self, frame: &[u8]) -> Send {
        if !self.up {
            return Send::Closed;
        }
        // SAFETY: `frame` is valid for reads of `frame.len()` bytes for the
        // duration of the call; the fd is owned by `self`.
        let n = unsafe {
            libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n >= 0 {
            return Send::Sent;
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::WouldBlock => Send::WouldBlock,
            e if e.kind() == io::ErrorKind::Interrupted => Send::WouldBlock,
            // The frame's fault, not the link's: dropped by the caller.
            e if e.raw_os_error() == Some(libc::EMSGSIZE) => Send::TooLarge,
            e => {
                tracing::warn!("virtio-net: send: {e}");
                self.down("send failed");
                Send::Closed
            }
        }
    }

    fn down(&mut self, why: &str) {
        if self.up {
            tracing::info!("virtio-net: link down: {why}");
            self.up = false;
            let _ = self.epoll.ctl(ControlOperation::Delete, self.fd.as_raw_fd(), EpollEvent::default());
        }
    }
}

fn socket_type(fd: RawFd) -> io::Result<i32> {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `kind` and `len` are valid for writes and `len` holds the size
    // of `kind`; getsockopt writes at most that many bytes.
    let r =
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, std::ptr::addr_of_mut!(kind).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(kind)
}

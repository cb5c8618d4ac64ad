//! One proto message per `SOCK_SEQPACKET` datagram, file descriptors as
//! `SCM_RIGHTS` with it: the agent's links to its isolator and to each
//! session's init (`pvisor.isolator.v1`). Blocking calls for the isolator and
//! the session inits (single-threaded, no runtime), [`AsyncLink`] for the agent.
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use prost::Message;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::unix::AsyncFd;

/// Largest message either side sends (a spawn's environment is the big one).
pub const MAX_MESSAGE: usize = 192 << 10;
/// Most descriptors one message carries (a spawn's stdin, stdout and stderr).
pub const MAX_FDS: usize = 4;

/// A SOCK_SEQPACKET pair, both ends close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).map_err(io::Error::from)
}

fn send_raw(fd: RawFd, msg: &impl Message, fds: &[RawFd], flags: MsgFlags) -> io::Result<()> {
    let buf = msg.encode_to_vec();
    if buf.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message of {} bytes is too large", buf.len()),
        ));
    }
    let iov = [io::IoSlice::new(&buf)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    // An empty message would read as EOF on the other side: proto3 encodes an
    // all-default message as nothing, so every message sent here has a set field.
    sendmsg::<()>(fd, &iov, cmsgs, flags | MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)?;
    Ok(())
}

/// What one receive brought.
pub enum Received<M> {
    Message(M, Vec<OwnedFd>),
    /// The other end is closed.
    Closed,
}

fn recv_raw<M: Message + Default>(fd: RawFd, flags: MsgFlags) -> io::Result<Received<M>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg =
        recvmsg::<()>(fd, &mut iov, Some(&mut space), flags | MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: SCM_RIGHTS installed these fds in this process just now;
            // nothing else refers to them.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let (n, truncated) = (msg.bytes, msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC));
    if n == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    if truncated {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "message or descriptors truncated"));
    }
    let m = M::decode(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Received::Message(m, fds))
}

/// Sends `msg` with `fds` (blocking).
pub fn send(fd: &impl AsRawFd, msg: &impl Message, fds: &[RawFd]) -> io::Result<()> {
    loop {
        match send_raw(fd.as_raw_fd(), msg, fds, MsgFlags::empty()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Receives one message (blocking).
pub fn recv<M: Message + Default>(fd: &impl AsRawFd) -> io::Result<Received<M>> {
    loop {
        match recv_raw(fd.as_raw_fd(), MsgFlags::empty()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// The agent's end of a link, for tokio. Sends from several tasks are fine
/// (each datagram is atomic); one task should receive.
pub struct AsyncLink {
    fd: AsyncFd<OwnedFd>,
}

impl AsyncLink {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        // SAFETY: `fd` is an open socket owned by the AsyncFd for its whole
        // life; OwnedFd::as_raw_fd always returns that same descriptor.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(AsyncLink { fd })
    }

    pub async fn send(&self, msg: &impl Message, fds: &[RawFd]) -> io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|s| send_raw(s.get_ref().as_raw_fd(), msg, fds, MsgFlags::MSG_DONTWAIT)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn recv<M: Message + Default>(&self) -> io::Result<Received<M>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|s| recv_raw(s.get_ref().as_raw_fd(), MsgFlags::MSG_DONTWAIT)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::isolator::{init_event, InitEvent, Spawned};

    #[test]
    fn messages_and_descriptors_cross() {
        let (a, b) = pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let ev = InitEvent { seq: 7, kind: Some(init_event::Kind::Spawned(Spawned { pid: 42 })) };
        send(&a, &ev, &[r.as_raw_fd(), w.as_raw_fd()]).unwrap();
        let Received::Message(got, fds) = recv::<InitEvent>(&b).unwrap() else { panic!("closed") };
        assert_eq!(got, ev);
        assert_eq!(fds.len(), 2);
        // The received write end feeds the original read end.
        nix::unistd::write(&fds[1], b"x").unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(nix::unistd::read(r.as_raw_fd(), &mut buf).unwrap(), 1);
        drop(a);
        assert!(matches!(recv::<InitEvent>(&b).unwrap(), Received::Closed));
    }

    #[test]
    fn oversized_messages_are_refused() {
        let (a, _b) = pair().unwrap();
        let spawn = pvisor_proto::isolator::Spawn { env: vec!["X".repeat(MAX_MESSAGE)], ..Default::default() };
        let err = send(&a, &spawn, &[]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn async_link_round_trip() {
        let (a, b) = pair().unwrap();
        let (a, b) = (AsyncLink::new(a).unwrap(), AsyncLink::new(b).unwrap());
        let ev = InitEvent { seq: 1, kind: Some(init_event::Kind::Spawned(Spawned { pid: 3 })) };
        a.send(&ev, &[]).await.unwrap();
        let Received::Message(got, fds) = b.recv::<InitEvent>().await.unwrap() else { panic!("closed") };
        assert_eq!((got, fds.len()), (ev, 0));
        drop(a);
        assert!(matches!(b.recv::<InitEvent>().await.unwrap(), Received::Closed));
    }
}

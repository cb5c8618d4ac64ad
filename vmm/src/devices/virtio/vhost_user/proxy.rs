//! A relay between a vhost-user front-end and a `vhost-user-backend`
//! daemon that absorbs SET_VRING_ENABLE where the crate would reject it.
//!
//! QEMU 7.2's vhost-user netdev sends SET_VRING_ENABLE while
//! VHOST_USER_F_PROTOCOL_FEATURES is not (yet) acked in SET_FEATURES (it
//! enables the queue pair when the guest writes its features, before the
//! device starts). The spec says that request needs the bit negotiated, and
//! `vhost-user-backend` drops the connection. So the relay answers such a
//! request itself (an ack when one is asked for) and remembers the state it
//! asked for; once a SET_FEATURES acking the bit has gone through, it passes
//! the remembered states on (without the bit, SET_FEATURES enables the rings
//! itself). Every other message is forwarded unchanged, file descriptors
//! included.
//!
//! The relay's back-end connection is made before the worker's seccomp
//! filter exists; afterwards it only accepts the front-end and moves bytes
//! (`accept4`, `recvmsg`, `sendmsg`, `read`, `write`, `shutdown`).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use vhost::vhost_user::message::VhostUserVirtioFeatures;

/// vhost-user request codes the relay looks at.
const SET_FEATURES: u32 = 2;
const SET_VRING_ENABLE: u32 = 18;
/// Header flags: protocol version 1, reply, reply wanted.
const VERSION_1: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// Header: request, flags, payload size (u32 each).
const HEADER_LEN: usize = 12;
/// Largest payload a vhost-user message carries (the memory table is the biggest).
const MAX_PAYLOAD: usize = 4096;
/// Most fds one message carries (SET_MEM_TABLE: one per region).
const MAX_FDS: usize = 32;

/// Relays the first front-end that connects to `front` to `back` (already
/// connected to the daemon) on a thread named `name`.
pub(super) fn spawn(name: &str, front: UnixListener, back: UnixStream) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_string()).spawn(move || {
        let front = match front.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("vhost-user relay: accept: {e}");
                return;
            }
        };
        if let Err(e) = relay(front, back) {
            tracing::debug!("vhost-user relay ended: {e}");
        }
    })
}

fn relay(front: UnixStream, back: UnixStream) -> io::Result<()> {
    let front_writer = Arc::new(Mutex::new(front.try_clone()?));
    let (mut back_reader, writer) = (back.try_clone()?, front_writer.clone());
    // Back-end to front-end: replies only, no fds; copied as they come.
    let replies = std::thread::Builder::new().name("vu-relay-replies".into()).spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match back_reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut w = writer.lock().unwrap_or_else(PoisonError::into_inner);
                    if w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let w = writer.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = w.shutdown(std::net::Shutdown::Write);
    })?;
    let result = requests(&front, &back, &front_writer);
    let _ = back.shutdown(std::net::Shutdown::Write);
    let _ = replies.join();
    result
}

/// Front-end to back-end: message by message.
fn requests(front: &UnixStream, back: &UnixStream, front_writer: &Mutex<UnixStream>) -> io::Result<()> {
    let mut protocol_features_acked = false;
    // Ring index -> enable, asked for before the bit was acked.
    let mut early_enables = std::collections::BTreeMap::<u32, u32>::new();
    let mut payload = vec![0u8; MAX_PAYLOAD];
    loop {
        let mut header = [0u8; HEADER_LEN];
        let Some(fds) = read_header(front.as_raw_fd(), &mut header)? else { return Ok(()) };
        let word = |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (request, flags, size) = (word(0), word(4), word(8) as usize);
        if size > MAX_PAYLOAD {
            return Err(io::Error::other(format!("vhost-user message of {size} bytes")));
        }
        (&*front).read_exact(&mut payload[..size])?;
        if request == SET_FEATURES && size >= 8 {
            let mut value = [0u8; 8];
            value.copy_from_slice(&payload[..8]);
            let features = u64::from_le_bytes(value);
            protocol_features_acked = features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        }
        if request == SET_VRING_ENABLE && !protocol_features_acked {
            if size >= 8 {
                let index = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
                let num = u32::from_le_bytes([payload[4], payload[5], payload[6], payload[7]]);
                early_enables.insert(index, num);
            }
            if flags & FLAG_NEED_REPLY != 0 {
                let mut reply = Vec::with_capacity(HEADER_LEN + 8);
                reply.extend_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                reply.extend_from_slice(&(VERSION_1 | FLAG_REPLY).to_le_bytes());
                reply.extend_from_slice(&8u32.to_le_bytes());
                reply.extend_from_slice(&0u64.to_le_bytes());
                front_writer.lock().unwrap_or_else(PoisonError::into_inner).write_all(&reply)?;
            }
            continue;
        }
        let mut message = header.to_vec();
        message.extend_from_slice(&payload[..size]);
        send_with_fds(back.as_raw_fd(), &message, &fds)?;
        if request == SET_FEATURES && protocol_features_acked {
            for (index, num) in std::mem::take(&mut early_enables) {
                // No reply wanted: the front-end is not waiting for one.
                let mut m = Vec::with_capacity(HEADER_LEN + 8);
                for word in [SET_VRING_ENABLE, VERSION_1, 8, index, num] {
                    m.extend_from_slice(&word.to_le_bytes());
                }
                send_with_fds(back.as_raw_fd(), &m, &[])?;
            }
        }
    }
}

/// Reads one message header and the fds sent with it; `None` at the end.
fn read_header(fd: RawFd, header: &mut [u8; HEADER_LEN]) -> io::Result<Option<Vec<OwnedFd>>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < HEADER_LEN {
        let mut iov = [io::IoSliceMut::new(&mut header[got..])];
        let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
        let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: the kernel just installed these fds in this
                // process for us; nothing else owns them.
                fds.extend(
                    received.into_iter().map(|f| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(f) }),
                );
            }
        }
        if msg.bytes == 0 {
            return if got == 0 { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
        }
        got += msg.bytes;
    }
    Ok(Some(fds))
}

fn send_with_fds(fd: RawFd, message: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let mut sent = sendmsg::<()>(fd, &[io::IoSlice::new(message)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)?;
    // The rest (rare: a full socket buffer) without fds again.
    while sent < message.len() {
        let n = sendmsg::<()>(fd, &[io::IoSlice::new(&message[sent..])], &[], MsgFlags::MSG_NOSIGNAL, None)
            .map_err(io::Error::from)?;
        sent += n;
    }
    Ok(())
}

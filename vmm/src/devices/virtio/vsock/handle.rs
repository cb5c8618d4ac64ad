//! In-process host-initiated connections to the guest.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use super::muxer::ConnectRequest;

/// Reaches the guest from the host process: each connect hands the vsock
/// back-end one end of a socketpair. Cheap to clone; usable from any thread.
#[derive(Clone)]
pub struct VsockHandle {
    requests: Sender<ConnectRequest>,
    wake: Arc<EventFd>,
}

impl VsockHandle {
    pub(super) fn new(requests: Sender<ConnectRequest>, wake: Arc<EventFd>) -> Self {
        Self { requests, wake }
    }

    /// Connects to guest `port` and waits (up to `timeout`) for the guest to
    /// accept. `ConnectionRefused` if nothing listens there (the guest
    /// answered RST); `TimedOut` if the guest did not answer in time (the
    /// attempt is then abandoned: a late acceptance is reset).
    pub fn connect(&self, port: u32, timeout: Duration) -> io::Result<UnixStream> {
        let (ours, theirs) = UnixStream::pair()?;
        theirs.set_nonblocking(true)?;
        let (reply, answer) = mpsc::channel();
        self.requests
            .send(ConnectRequest { port, stream: theirs, reply })
            .map_err(|_| io::Error::new(io::ErrorKind::NotConnected, "vsock device is gone"))?;
        self.wake.write(1)?;
        match answer.recv_timeout(timeout) {
            Ok(Ok(())) => Ok(ours),
            Ok(Err(e)) => Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(io::ErrorKind::TimedOut.into()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(io::Error::new(io::ErrorKind::NotConnected, "vsock device is gone"))
            }
        }
    }
}

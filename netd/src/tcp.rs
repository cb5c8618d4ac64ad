//! TCP flows: a held SYN while the host connect runs, then a smoltcp socket
//! spliced to the host stream with bounded buffers (smoltcp's windows: a slow
//! reader on either side closes the other side's window, nothing queues
//! beyond them). Half-closes and resets go both ways.
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddrV4};
use std::os::fd::AsRawFd;

use mio::net::TcpStream;
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, State as TcpState};
use smoltcp::wire::{EthernetAddress, IpListenEndpoint};

/// How long a sandbox may leave sent data unacknowledged.
const GUEST_TIMEOUT_SECS: u64 = 120;

/// A flow's identity: the sandbox's end and the remote end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub guest: SocketAddrV4,
    pub remote: SocketAddrV4,
}

pub enum State {
    /// The host connect is under way; the sandbox's SYN waits in `syn`.
    Connecting { syn: Vec<u8>, seq: u32, seg_len: u32 },
    /// Spliced to smoltcp socket `handle`.
    Open { handle: SocketHandle },
}

pub struct Flow {
    pub key: Key,
    /// Bytes of smoltcp buffer (both directions) the flow holds once open.
    pub buffer_bytes: usize,
    pub mac: EthernetAddress,
    pub stream: TcpStream,
    pub state: State,
    /// The host stream may have data / room (cleared on WouldBlock).
    pub readable: bool,
    pub writable: bool,
    /// The host sent its FIN (our FIN to the sandbox is queued).
    host_eof: bool,
    /// The sandbox's FIN was passed on (host stream shut for writing).
    shut_wr: bool,
    /// The socket was aborted; removed once smoltcp has sent its RST.
    aborted: bool,
}

/// What servicing a flow found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Keep,
    /// Done: drop the flow.
    Remove,
}

impl Flow {
    pub fn new(key: Key, mac: EthernetAddress, stream: TcpStream, syn: Vec<u8>, seq: u32, seg_len: u32) -> Flow {
        Flow {
            key,
            buffer_bytes: 0,
            mac,
            stream,
            state: State::Connecting { syn, seq, seg_len },
            readable: false,
            writable: false,
            host_eof: false,
            shut_wr: false,
            aborted: false,
        }
    }

    /// For a connecting flow: `Ok(true)` once connected, `Ok(false)` while
    /// under way, `Err` when it failed.
    pub fn connect_result(&self) -> io::Result<bool> {
        if let Some(e) = self.stream.take_error()? {
            return Err(e);
        }
        match self.stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves splicing along in both directions; called after every smoltcp
    /// poll and host event.
    pub fn service(&mut self, sockets: &mut SocketSet<'_>) -> Outcome {
        let State::Open { handle } = self.state else { return Outcome::Keep };
        let sock = sockets.get_mut::<tcp::Socket>(handle);
        if self.aborted {
            return Outcome::Remove;
        }
        match sock.state() {
            TcpState::Listen | TcpState::SynReceived | TcpState::SynSent => return Outcome::Keep,
            TcpState::Closed => {
                // Closed without both FINs: the sandbox reset it; reset the host side too.
                if !(self.host_eof && self.shut_wr) {
                    reset_on_close(&self.stream);
                }
                return Outcome::Remove;
            }
            _ => {}
        }
        // Sandbox -> host.
        while self.writable && sock.can_recv() {
            let stream = &mut self.stream;
            match sock.recv(|buf| match stream.write(buf) {
                Ok(n) => (n, Ok(n)),
                Err(e) => (0, Err(e)),
            }) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => self.writable = false,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(_)) => return self.abort(sock),
                Err(_) => break,
            }
        }
        if !self.shut_wr
            && sock.recv_queue() == 0
            && matches!(sock.state(), TcpState::CloseWait | TcpState::LastAck | TcpState::Closing | TcpState::TimeWait)
        {
            let _ = self.stream.shutdown(Shutdown::Write);
            self.shut_wr = true;
        }
        // Host -> sandbox.
        while self.readable && !self.host_eof && sock.can_send() {
            let stream = &mut self.stream;
            match sock.send(|buf| match stream.read(buf) {
                Ok(n) => (n, Ok(n)),
                Err(e) => (0, Err(e)),
            }) {
                Ok(Ok(0)) => {
                    self.host_eof = true;
                    sock.close();
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(_)) => return self.abort(sock),
                Err(_) => break,
            }
        }
        // Both FINs exchanged and everything delivered: smoltcp's TIME-WAIT is
        // not worth keeping the host socket for.
        if sock.state() == TcpState::TimeWait && self.shut_wr {
            return Outcome::Remove;
        }
        Outcome::Keep
    }

    /// The host side failed (reset, error): reset the sandbox's side. The flow
    /// stays until the next poll has sent smoltcp's RST.
    fn abort(&mut self, sock: &mut tcp::Socket<'_>) -> Outcome {
        sock.abort();
        self.aborted = true;
        Outcome::Keep
    }

    /// One line of the flow's state (see `Stack::describe`).
    pub fn describe(&self, sockets: &SocketSet<'_>) -> String {
        let flags = format!(
            "readable {} writable {} host_eof {} shut_wr {} aborted {}",
            self.readable, self.writable, self.host_eof, self.shut_wr, self.aborted
        );
        match self.state {
            State::Connecting { .. } => format!("{:?}: connecting; {flags}", self.key),
            State::Open { handle } => {
                let sock = sockets.get::<tcp::Socket>(handle);
                format!(
                    "{:?}: {} send queue {} recv queue {} can_send {} can_recv {}; {flags}",
                    self.key,
                    sock.state(),
                    sock.send_queue(),
                    sock.recv_queue(),
                    sock.can_send(),
                    sock.can_recv(),
                )
            }
        }
    }

    /// Whether the flow waits for the next poll only (aborted).
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }
}

/// A smoltcp socket listening on exactly the remote endpoint of `key`, so the
/// held SYN (and nothing else) opens it.
pub fn socket(key: &Key, buffer: usize) -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(tcp::SocketBuffer::new(vec![0; buffer]), tcp::SocketBuffer::new(vec![0; buffer]));
    s.set_nagle_enabled(false);
    // ACK at once: the sandbox's sender should not wait on netd's timers.
    s.set_ack_delay(None);
    // A sandbox that stops acknowledging what netd sent is given up on (RST)
    // after this; an idle connection with nothing in flight is never timed out.
    s.set_timeout(Some(smoltcp::time::Duration::from_secs(GUEST_TIMEOUT_SECS)));
    // A fresh socket in the Closed state always accepts a listen; the
    // endpoint's port is never 0 (the SYN's destination port).
    let _ = s.listen(IpListenEndpoint { addr: Some((*key.remote.ip()).into()), port: key.remote.port() });
    s
}

/// Makes the host stream's close send a RST (SO_LINGER 0).
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: the option value is a linger struct that outlives the call, its size is passed.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// The flow table: slots (mio tokens index them) and a map by key.
pub type Flows = crate::slots::Slots<Flow>;

impl crate::slots::Keyed for Flow {
    type Key = Key;
    fn key(&self) -> Key {
        self.key
    }
}

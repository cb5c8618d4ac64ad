//! One vsock stream: its host socket, state, and the credit counters of
//! both directions.

use std::num::Wrapping;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;

use vmm_sys_util::epoll::EventSet;

use super::BUF_ALLOC;

/// Where a connection is in its life.
#[derive(Debug)]
pub(super) enum State {
    /// The host asked the guest (REQUEST sent), no answer yet. `reply`
    /// reaches an in-process [`super::VsockHandle::connect`] caller;
    /// `announce` says whether the host peer waits for `OK <port>\n`.
    LocalInit { reply: Option<Sender<std::io::Result<()>>>, announce: bool },
    /// Data flows.
    Established,
}

/// One connection of the table.
#[derive(Debug)]
pub(super) struct Connection {
    pub stream: UnixStream,
    pub token: u64,
    pub state: State,
    /// Guest → host: bytes received from the guest not yet written to the
    /// host socket.
    pub tx_buf: Vec<u8>,
    /// Guest → host: bytes written to the host socket (our fwd_cnt).
    pub fwd_cnt: Wrapping<u32>,
    /// The fwd_cnt the guest last heard from us.
    pub last_fwd_cnt_sent: Wrapping<u32>,
    /// A CREDIT_UPDATE for this connection is queued.
    pub credit_update_queued: bool,
    /// Host → guest: bytes sent to the guest.
    pub rx_cnt: Wrapping<u32>,
    /// The guest's receive buffer and how much of it it consumed.
    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: Wrapping<u32>,
    /// SHUTDOWN flags the guest sent.
    pub peer_shutdown: u32,
    /// The host socket reached end of file (we told the guest).
    pub host_eof: bool,
    /// The host socket hung up entirely; it is no longer polled.
    pub host_hup: bool,
    /// Queued for the rx path (host data or EOF to forward).
    pub rx_queued: bool,
    /// The events the socket is registered for (None: not registered).
    pub interest: Option<EventSet>,
}

impl Connection {
    pub fn new(stream: UnixStream, token: u64, state: State) -> Self {
        Self {
            stream,
            token,
            state,
            tx_buf: Vec::new(),
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            credit_update_queued: false,
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            peer_shutdown: 0,
            host_eof: false,
            host_hup: false,
            rx_queued: false,
            interest: None,
        }
    }

    /// Bytes the guest can still take from us.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Takes the credit fields of a guest packet.
    pub fn update_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = Wrapping(fwd_cnt);
    }

    /// Whether the guest should hear our fwd_cnt (it consumed a quarter of
    /// the credit since it last did).
    pub fn needs_credit_update(&self) -> bool {
        (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= BUF_ALLOC / 4
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// The events the host socket should be polled for now.
    pub fn wanted_interest(&self) -> EventSet {
        let mut events = EventSet::empty();
        let reading = self.is_established()
            && !self.host_eof
            && !self.rx_queued
            && self.peer_shutdown & super::packet::SHUTDOWN_RCV == 0
            && self.peer_credit() > 0;
        if reading {
            events |= EventSet::IN;
        }
        if !self.tx_buf.is_empty() {
            events |= EventSet::OUT;
        }
        events
    }
}

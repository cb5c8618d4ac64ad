//! Packets from the guest (tx): connection requests, data, credit,
//! shutdown and reset.

use std::io;
use std::path::Path;

use super::{connect_nonblocking, send, ConnKey, Muxer, Source};
use crate::devices::virtio::vsock::connection::{Connection, State};
use crate::devices::virtio::vsock::packet::*;
use crate::devices::virtio::vsock::{BUF_ALLOC, HOST_CID, MAX_CONNECTIONS};

impl Muxer {
    /// Handles one packet the guest sent on tx.
    pub fn handle_tx(&mut self, header: &Header, payload: &[u8]) {
        if header.src_cid != self.guest_cid || header.dst_cid != HOST_CID {
            tracing::debug!("vsock: dropping packet {} -> {}", header.src_cid, header.dst_cid);
            return;
        }
        let key = (header.dst_port, header.src_port);
        if header.kind != TYPE_STREAM {
            if header.op != OP_RST {
                self.queue_control(key, OP_RST, 0);
            }
            return;
        }
        if !self.conns.contains_key(&key) {
            match header.op {
                OP_REQUEST => self.guest_connect(key, header),
                OP_RST => {}
                _ => self.queue_control(key, OP_RST, 0),
            }
            return;
        }
        if let Some(conn) = self.conns.get_mut(&key) {
            conn.update_peer_credit(header.buf_alloc, header.fwd_cnt);
            if conn.host_hup && !conn.host_eof && conn.peer_credit() > 0 {
                // A hung-up socket is not polled: its rest is forwarded as
                // credit allows.
                self.queue_rx(key);
            }
        }
        match header.op {
            OP_RESPONSE => self.guest_accepted(key),
            OP_RW => self.guest_data(key, payload),
            OP_CREDIT_UPDATE => {}
            OP_CREDIT_REQUEST => self.queue_credit_update(key),
            OP_SHUTDOWN => self.guest_shutdown(key, header.flags),
            OP_RST => self.remove(key),
            _ => self.reset_conn(key),
        }
        self.update_interest(key);
    }

    fn queue_credit_update(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.credit_update_queued {
                conn.credit_update_queued = true;
                self.queue_control(key, OP_CREDIT_UPDATE, 0);
            }
        }
    }

    fn guest_connect(&mut self, key: ConnKey, header: &Header) {
        let Some(base) = &self.uds_path else {
            self.queue_control(key, OP_RST, 0);
            return;
        };
        if self.conns.len() >= MAX_CONNECTIONS {
            self.queue_control(key, OP_RST, 0);
            return;
        }
        let mut path = base.clone().into_os_string();
        path.push(format!("_{}", key.0));
        match connect_nonblocking(Path::new(&path)) {
            Ok(stream) => {
                let token = self.alloc_token();
                let mut conn = Connection::new(stream, token, State::Established);
                conn.update_peer_credit(header.buf_alloc, header.fwd_cnt);
                self.conns.insert(key, conn);
                self.sources.insert(token, Source::Conn(key));
                self.queue_control(key, OP_RESPONSE, 0);
                self.update_interest(key);
            }
            Err(e) => {
                tracing::debug!("vsock: guest connect to port {}: {e}", key.0);
                self.queue_control(key, OP_RST, 0);
            }
        }
    }

    fn guest_accepted(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        let State::LocalInit { reply, announce } = std::mem::replace(&mut conn.state, State::Established) else {
            // RESPONSE on an established connection is a protocol error.
            self.reset_conn(key);
            return;
        };
        if announce {
            let line = format!("OK {}\n", key.0);
            // A fresh socket's send buffer always has room for the line.
            if !matches!(send(&conn.stream, line.as_bytes()), Ok(n) if n == line.len()) {
                self.reset_conn(key);
                return;
            }
        }
        if let Some(reply) = reply {
            if reply.send(Ok(())).is_err() {
                // The caller gave up waiting; its end is gone.
                self.reset_conn(key);
            }
        }
    }

    fn guest_data(&mut self, key: ConnKey, payload: &[u8]) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if !conn.is_established() || conn.peer_shutdown & SHUTDOWN_SEND != 0 {
            self.reset_conn(key);
            return;
        }
        let mut written = 0;
        if conn.tx_buf.is_empty() {
            match send(&conn.stream, payload) {
                Ok(n) => written = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.reset_conn(key);
                    return;
                }
            }
        }
        let rest = &payload[written..];
        if conn.tx_buf.len() + rest.len() > BUF_ALLOC as usize {
            // The guest sent beyond the credit we gave it.
            self.reset_conn(key);
            return;
        }
        conn.tx_buf.extend_from_slice(rest);
        conn.fwd_cnt += written as u32;
        if conn.needs_credit_update() {
            self.queue_credit_update(key);
        }
    }

    fn guest_shutdown(&mut self, key: ConnKey, flags: u32) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        conn.peer_shutdown |= flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
        self.finish_shutdown(key);
    }

    /// Applies the guest's shutdown once its data reached the host: both
    /// directions closed ends the connection with RST (what the guest waits
    /// for), send closed half-closes the host socket.
    fn finish_shutdown(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if !conn.tx_buf.is_empty() {
            return;
        }
        if conn.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND {
            self.reset_conn(key);
        } else if conn.peer_shutdown & SHUTDOWN_SEND != 0 {
            let _ = conn.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    pub(super) fn flush_tx(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        while !conn.tx_buf.is_empty() {
            match send(&conn.stream, &conn.tx_buf) {
                Ok(n) => {
                    conn.tx_buf.drain(..n);
                    conn.fwd_cnt += n as u32;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.reset_conn(key);
                    return;
                }
            }
        }
        if conn.needs_credit_update() {
            self.queue_credit_update(key);
        }
        self.finish_shutdown(key);
    }
}

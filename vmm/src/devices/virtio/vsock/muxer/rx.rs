//! Packets to the guest (rx): control packets first, then host data as
//! the guest's credit and rx buffers allow.

use std::os::fd::AsRawFd;

use nix::sys::socket::{self, MsgFlags};
use virtio_queue::{Queue, QueueOwnedT, QueueT, Writer};

use super::{ConnKey, Muxer};
use crate::devices::virtio::vsock::packet::{self, Header, *};
use crate::devices::virtio::vsock::{BUF_ALLOC, HOST_CID};
use crate::devices::virtio::GuestMemory;

impl Muxer {
    /// Whether anything waits for rx buffers.
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty() || !self.rx_ready.is_empty()
    }

    /// Fills the guest's rx buffers with control packets, then host data.
    /// Returns whether any buffer was used.
    pub fn fill_rx(&mut self, queue: &mut Queue, mem: &GuestMemory) -> bool {
        let mut used = false;
        while self.has_rx() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else { break };
            let head = chain.head_index();
            let mut writer = match Writer::new(mem, chain) {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!("vsock: bad rx chain: {e}");
                    used |= queue.add_used(mem, head, 0).is_ok();
                    continue;
                }
            };
            let len = match self.next_rx_packet(&mut writer) {
                RxOutcome::Written(len) => len,
                RxOutcome::BadBuffer => 0,
                RxOutcome::Nothing => {
                    queue.go_to_previous_position();
                    break;
                }
            };
            if queue.add_used(mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        used
    }

    fn header_for(&mut self, key: ConnKey, op: u16) -> Header {
        let mut header = Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.0,
            dst_port: key.1,
            kind: TYPE_STREAM,
            op,
            ..Header::default()
        };
        if let Some(conn) = self.conns.get_mut(&key) {
            header.buf_alloc = BUF_ALLOC;
            header.fwd_cnt = conn.fwd_cnt.0;
            conn.last_fwd_cnt_sent = conn.fwd_cnt;
            if op == OP_CREDIT_UPDATE {
                conn.credit_update_queued = false;
            }
        }
        header
    }

    fn next_rx_packet(&mut self, writer: &mut Writer<'_>) -> RxOutcome {
        let Ok(capacity) = packet::rx_capacity(writer) else { return RxOutcome::BadBuffer };
        if let Some(control) = self.control.pop_front() {
            let mut header = self.header_for(control.key, control.op);
            header.flags = control.flags;
            return match packet::write_rx(writer, &header, &[]) {
                Ok(len) => RxOutcome::Written(len),
                Err(_) => RxOutcome::BadBuffer,
            };
        }
        // Each queued connection gets one try per buffer; one that requeues
        // itself is not retried within the same call.
        for _ in 0..self.rx_ready.len() {
            let Some(key) = self.rx_ready.pop_front() else { break };
            if let Some(outcome) = self.conn_rx(key, writer, capacity) {
                return outcome;
            }
        }
        RxOutcome::Nothing
    }

    /// Forwards what the host socket of `key` has: data up to the guest's
    /// credit, or its EOF. None if it had nothing (back to polling).
    fn conn_rx(&mut self, key: ConnKey, writer: &mut Writer<'_>, capacity: usize) -> Option<RxOutcome> {
        let conn = self.conns.get_mut(&key)?;
        conn.rx_queued = false;
        if !conn.is_established() || conn.host_eof {
            self.update_interest(key);
            return None;
        }
        let credit = conn.peer_credit() as usize;
        if credit == 0 && !conn.host_hup {
            // Polling resumes when the guest reports consumed data.
            self.update_interest(key);
            return None;
        }
        let want = capacity.min(credit).min(packet::MAX_PAYLOAD as usize);
        self.buf.resize(want.max(1), 0);
        let read = if want == 0 {
            Err(nix::errno::Errno::EAGAIN)
        } else {
            socket::recv(conn.stream.as_raw_fd(), &mut self.buf[..want], MsgFlags::empty())
        };
        let (op, len, flags) = match read {
            Ok(0) => {
                // End of file: the host sends no more (and, hung up, takes no more).
                conn.host_eof = true;
                let flags = if conn.host_hup { SHUTDOWN_SEND | SHUTDOWN_RCV } else { SHUTDOWN_SEND };
                (OP_SHUTDOWN, 0, flags)
            }
            Ok(n) => (OP_RW, n, 0),
            Err(nix::errno::Errno::EAGAIN) => {
                self.update_interest(key);
                return None;
            }
            Err(nix::errno::Errno::EINTR) => {
                conn.rx_queued = true;
                self.rx_ready.push_back(key);
                return None;
            }
            Err(_) => {
                self.reset_conn(key);
                return None;
            }
        };
        if op == OP_RW {
            conn.rx_cnt += len as u32;
            // There may be more: stay queued.
            conn.rx_queued = true;
            self.rx_ready.push_back(key);
        }
        let mut header = self.header_for(key, op);
        header.len = len as u32;
        header.flags = flags;
        let outcome = match packet::write_rx(writer, &header, &self.buf[..len]) {
            Ok(n) => RxOutcome::Written(n),
            Err(_) => RxOutcome::BadBuffer,
        };
        self.update_interest(key);
        Some(outcome)
    }
}

enum RxOutcome {
    Written(u32),
    BadBuffer,
    Nothing,
}

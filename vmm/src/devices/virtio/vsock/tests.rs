//! virtio-vsock driven as a guest driver does: packets on tx, buffers on
//! rx, against real host Unix sockets.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use virtio_queue::Queue;

use super::packet::*;
use super::{Vsock, BUF_ALLOC, EVENT_QUEUE, HOST_CID, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::test_utils::{memory, read, write, Buf, DriverQueue};
use crate::devices::virtio::{GuestMemory, VirtioDevice};

const GUEST_CID: u64 = 3;
const TX_BUF: u64 = 0x20_0000;
const RX_BUFS: u64 = 0x30_0000;
const RX_BUF_LEN: u32 = 44 + 4096;

struct Guest {
    mem: GuestMemory,
    rx: DriverQueue,
    tx: DriverQueue,
    queues: Vec<Queue>,
    dev: Vsock,
    rx_addr: HashMap<u32, u64>,
    _dir: tempfile::TempDir,
    uds: PathBuf,
}

fn hdr(op: u16, src_port: u32, dst_port: u32) -> Header {
    Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        kind: TYPE_STREAM,
        op,
        buf_alloc: 64 * 1024,
        ..Header::default()
    }
}

impl Guest {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("v.sock");
        let mem = memory();
        let rx = DriverQueue::new(&mem, 0x1_0000, 64);
        let tx = DriverQueue::new(&mem, 0x4_0000, 64);
        let ev = DriverQueue::new(&mem, 0x7_0000, 4);
        let queues = vec![rx.device_queue(), tx.device_queue(), ev.device_queue()];
        let dev = Vsock::new(GUEST_CID, Some(uds.clone())).expect("vsock");
        Self { mem, rx, tx, queues, dev, rx_addr: HashMap::new(), _dir: dir, uds }
    }

    fn port_path(&self, port: u32) -> PathBuf {
        let mut p = self.uds.clone().into_os_string();
        p.push(format!("_{port}"));
        p.into()
    }

    /// Sends a packet on tx (header and payload in separate descriptors).
    fn send(&mut self, header: Header, payload: &[u8]) {
        let mut header = header;
        header.len = payload.len() as u32;
        write(&self.mem, TX_BUF, &header.encode());
        let mut chain = vec![Buf::r(TX_BUF, HEADER_LEN as u32)];
        if !payload.is_empty() {
            write(&self.mem, TX_BUF + 0x1000, payload);
            chain.push(Buf::r(TX_BUF + 0x1000, payload.len() as u32));
        }
        self.send_chain(&chain);
    }

    fn send_chain(&mut self, chain: &[Buf]) {
        self.tx.add_chain(&self.mem, chain);
        let used = self.dev.process_queue(TX_QUEUE, &mut self.queues, &self.mem);
        assert!(used.contains(TX_QUEUE));
        assert_eq!(self.tx.take_used(&self.mem).len(), 1);
    }

    /// Offers `n` rx buffers of `len` bytes.
    fn give_rx_len(&mut self, n: usize, len: u32) {
        for _ in 0..n {
            let slot = self.rx_addr.len() as u64;
            let addr = RX_BUFS + slot * 0x2000;
            let head = self.rx.add_chain(&self.mem, &[Buf::w(addr, len)]);
            self.rx_addr.insert(u32::from(head), addr);
        }
        self.dev.process_queue(RX_QUEUE, &mut self.queues, &self.mem);
    }

    fn give_rx(&mut self, n: usize) {
        self.give_rx_len(n, RX_BUF_LEN);
    }

    /// Packets the device put on rx since the last call.
    fn take_rx(&mut self) -> Vec<(Header, Vec<u8>)> {
        let used = self.rx.take_used(&self.mem);
        used.into_iter()
            .map(|(id, len)| {
                let addr = self.rx_addr.remove(&id).expect("known rx buffer");
                let raw = read(&self.mem, addr, HEADER_LEN);
                let header = Header::decode(raw.as_slice().try_into().expect("header"));
                assert_eq!(len as usize, HEADER_LEN + header.len as usize, "used length");
                (header, read(&self.mem, addr + HEADER_LEN as u64, header.len as usize))
            })
            .collect()
    }

    /// Waits for host-side activity and lets the device handle it.
    fn host_event(&mut self) {
        assert!(self.try_host_event(10_000), "no host event within 10 s (hang guard)");
    }

    /// Like `host_event`, but gives up after `ms` milliseconds (false).
    fn try_host_event(&mut self, ms: u16) -> bool {
        let fd = self.dev.event_fd().expect("vsock has an event fd");
        // SAFETY: the fd belongs to the device, which outlives this call.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(borrowed.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1;
        if ready {
            self.dev.handle_event(&mut self.queues, &self.mem);
        }
        ready
    }

    /// Guest-initiated connection to host `port` from guest port `gport`,
    /// accepted by `listener`.
    fn connect(&mut self, listener: &UnixListener, gport: u32, port: u32) -> UnixStream {
        self.send(hdr(OP_REQUEST, gport, port), &[]);
        let packets = self.take_rx();
        assert_eq!(packets.len(), 1);
        assert_eq!(packets[0].0.op, OP_RESPONSE);
        let (stream, _) = listener.accept().expect("host accepts");
        stream
    }
}

#[test]
fn config_is_the_guest_cid() {
    let g = Guest::new();
    let mut cid = [0u8; 8];
    g.dev.read_config(0, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), GUEST_CID);
    assert_eq!(g.dev.device_type(), 19);
    assert_eq!(g.dev.queue_max_sizes().len(), 3);
}

#[test]
fn guest_connect_and_data_both_ways() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(1234)).expect("bind");
    g.give_rx(8);
    g.send(hdr(OP_REQUEST, 5000, 1234), &[]);
    let packets = g.take_rx();
    assert_eq!(packets.len(), 1);
    let (response, _) = &packets[0];
    assert_eq!(response.op, OP_RESPONSE);
    assert_eq!((response.src_cid, response.dst_cid), (HOST_CID, GUEST_CID));
    assert_eq!((response.src_port, response.dst_port), (1234, 5000));
    assert_eq!(response.buf_alloc, BUF_ALLOC);
    let (mut host, _) = listener.accept().expect("accept");

    g.send(hdr(OP_RW, 5000, 1234), b"hello host");
    let mut got = [0u8; 10];
    host.read_exact(&mut got).expect("host reads");
    assert_eq!(&got, b"hello host");

    host.write_all(b"hello guest").expect("host writes");
    g.host_event();
    let packets = g.take_rx();
    assert_eq!(packets.len(), 1);
    assert_eq!(packets[0].0.op, OP_RW);
    assert_eq!(packets[0].0.fwd_cnt, 10, "fwd_cnt counts bytes delivered to the host");
    assert_eq!(packets[0].1, b"hello guest");
    assert_eq!(g.dev.connection_count(), 1);
}

#[test]
fn connect_to_nothing_is_reset() {
    let mut g = Guest::new();
    g.give_rx(4);
    g.send(hdr(OP_REQUEST, 5000, 999), &[]);
    let packets = g.take_rx();
    assert_eq!(packets.len(), 1);
    assert_eq!(packets[0].0.op, OP_RST);
    assert_eq!((packets[0].0.src_port, packets[0].0.dst_port), (999, 5000));
    assert_eq!(g.dev.connection_count(), 0);
    // Data for a connection that does not exist is answered RST too.
    g.send(hdr(OP_RW, 5001, 999), b"x");
    assert_eq!(g.take_rx()[0].0.op, OP_RST);
}

#[test]
fn control_packets_wait_for_rx_buffers() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(77)).expect("bind");
    g.send(hdr(OP_REQUEST, 5000, 77), &[]);
    assert!(g.take_rx().is_empty(), "no rx buffers yet");
    g.give_rx(1);
    assert_eq!(g.take_rx()[0].0.op, OP_RESPONSE);
    drop(listener);
}

#[test]
fn host_connect_through_the_listener() {
    let mut g = Guest::new();
    g.give_rx(4);
    let mut host = UnixStream::connect(&g.uds).expect("connect to the vsock listener");
    g.host_event(); // accept
    host.write_all(b"CONNECT 52\n").expect("write CONNECT");
    g.host_event(); // the line
    let packets = g.take_rx();
    assert_eq!(packets.len(), 1);
    let request = packets[0].0;
    assert_eq!(request.op, OP_REQUEST);
    assert_eq!((request.src_cid, request.dst_cid, request.dst_port), (HOST_CID, GUEST_CID, 52));
    let host_port = request.src_port;

    let mut response = hdr(OP_RESPONSE, 52, host_port);
    response.buf_alloc = 4096;
    g.send(response, &[]);
    let mut reader = BufReader::new(host.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("OK line");
    assert_eq!(line, format!("OK {host_port}\n"));

    host.write_all(b"ping").expect("host writes");
    g.host_event();
    let packets = g.take_rx();
    assert_eq!(packets[0].0.op, OP_RW);
    assert_eq!(packets[0].1, b"ping");
    g.send(hdr(OP_RW, 52, host_port), b"pong");
    let mut got = [0u8; 4];
    reader.read_exact(&mut got).expect("host reads");
    assert_eq!(&got, b"pong");
}

#[test]
fn bad_connect_lines_are_dropped() {
    let mut g = Guest::new();
    g.give_rx(4);
    let mut host = UnixStream::connect(&g.uds).expect("connect");
    g.host_event();
    host.write_all(b"HELLO 52\n").expect("write");
    g.host_event();
    assert!(g.take_rx().is_empty());
    let mut buf = [0u8; 1];
    assert_eq!(host.read(&mut buf).expect("closed"), 0, "the back-end hung up");
    // A partial line is consumed and waited on, not spun on.
    let mut host = UnixStream::connect(&g.uds).expect("connect");
    g.host_event();
    host.write_all(b"CONN").expect("write");
    g.host_event();
    assert!(!g.try_host_event(0), "a partial line leaves nothing ready");
    host.write_all(b"ECT 52\n").expect("write");
    g.host_event();
    assert_eq!(g.take_rx()[0].0.op, OP_REQUEST);
    let mut host = UnixStream::connect(&g.uds).expect("connect");
    g.host_event();
    host.write_all(&[b'x'; 40]).expect("write");
    g.host_event();
    // Closed with the line unread: end of file or a reset.
    match host.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "an overlong line is refused"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
    }
}

#[test]
fn handle_connect_in_process() {
    let mut g = Guest::new();
    g.give_rx(4);
    let handle = g.dev.handle();
    let connector = std::thread::spawn(move || handle.connect(1024, Duration::from_secs(30)));
    g.host_event();
    let packets = g.take_rx();
    assert_eq!(packets.len(), 1);
    let request = packets[0].0;
    assert_eq!((request.op, request.dst_port), (OP_REQUEST, 1024));
    g.send(hdr(OP_RESPONSE, 1024, request.src_port), &[]);
    let mut stream = connector.join().expect("thread").expect("connected");
    stream.write_all(b"grpc").expect("write");
    g.host_event();
    assert_eq!(g.take_rx()[0].1, b"grpc");
    g.send(hdr(OP_RW, 1024, request.src_port), b"reply");
    let mut got = [0u8; 5];
    stream.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"reply");

    // A port nothing listens on: the guest answers RST, connect fails.
    let handle = g.dev.handle();
    let connector = std::thread::spawn(move || handle.connect(2000, Duration::from_secs(30)));
    g.host_event();
    let request = g.take_rx()[0].0;
    g.send(hdr(OP_RST, 2000, request.src_port), &[]);
    let err = connector.join().expect("thread").expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn host_data_respects_guest_credit() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(1);
    let mut request = hdr(OP_REQUEST, 600, 9);
    request.buf_alloc = 1000;
    g.send(request, &[]);
    assert_eq!(g.take_rx()[0].0.op, OP_RESPONSE);
    let (mut host, _) = listener.accept().expect("accept");
    host.write_all(&[7u8; 3000]).expect("host writes");
    g.give_rx(8);
    g.host_event();
    let delivered: usize = g
        .take_rx()
        .iter()
        .map(|(h, p)| {
            assert_eq!(h.op, OP_RW);
            p.len()
        })
        .sum();
    assert_eq!(delivered, 1000, "exactly the guest's buf_alloc");
    // More rx buffers but no credit: nothing more.
    g.give_rx(4);
    assert!(g.take_rx().is_empty());
    // The guest consumed 1000 bytes: 1000 more may come.
    let mut update = hdr(OP_CREDIT_UPDATE, 600, 9);
    update.buf_alloc = 1000;
    update.fwd_cnt = 1000;
    g.send(update, &[]);
    g.host_event();
    let delivered: usize = g.take_rx().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(delivered, 1000);
}

#[test]
fn host_data_waits_for_rx_buffers() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(1);
    let mut host = g.connect(&listener, 600, 9);
    host.write_all(b"queued").expect("host writes");
    g.host_event();
    assert!(g.take_rx().is_empty(), "no rx buffer, nothing taken");
    // The bytes are still there once the guest offers a buffer.
    g.give_rx(1);
    let packets = g.take_rx();
    assert_eq!(packets[0].1, b"queued");
}

#[test]
fn rx_packets_fit_small_buffers() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(1);
    let mut host = g.connect(&listener, 600, 9);
    host.write_all(&[1u8; 100]).expect("host writes");
    g.give_rx_len(1, 44 + 30);
    g.host_event();
    let packets = g.take_rx();
    assert_eq!(packets[0].1.len(), 30);
    g.give_rx_len(1, 20); // too small for a header: returned empty
    assert_eq!(g.rx.take_used(&g.mem), vec![(2, 0)]);
    g.give_rx(1);
    let total: usize = g.take_rx().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(total, 70);
}

#[test]
fn guest_data_beyond_host_reading_is_buffered_then_flushed() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(16);
    let mut host = g.connect(&listener, 600, 9);
    // Fill the socket until the host side would block, then some more.
    let chunk = vec![3u8; 4000];
    let mut sent = 0usize;
    for _ in 0..60 {
        g.send(hdr(OP_RW, 600, 9), &chunk);
        sent += chunk.len();
    }
    assert!(sent <= BUF_ALLOC as usize);
    let mut got = vec![0u8; sent];
    let reader = std::thread::spawn(move || host.read_exact(&mut got).map(|()| got));
    // The device flushes as the host drains.
    while !reader.is_finished() {
        g.try_host_event(50);
    }
    let got = reader.join().expect("thread").expect("host read everything");
    assert!(got.iter().all(|b| *b == 3));
    // The guest learns the bytes were forwarded.
    let fwd = g.take_rx().into_iter().filter(|(h, _)| h.op == OP_CREDIT_UPDATE).map(|(h, _)| h.fwd_cnt).max();
    assert!(fwd.is_some_and(|f| f as usize >= BUF_ALLOC as usize / 4), "credit updates sent: {fwd:?}");
}

#[test]
fn guest_overrunning_credit_is_reset() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(4);
    let _host = g.connect(&listener, 600, 9); // never reads
    let chunk = vec![0u8; 60 * 1024];
    let mut reset = false;
    for _ in 0..(2 * BUF_ALLOC as usize / chunk.len() + 4) {
        g.send(hdr(OP_RW, 600, 9), &chunk);
        if g.take_rx().iter().any(|(h, _)| h.op == OP_RST) {
            reset = true;
            break;
        }
    }
    assert!(reset, "a guest sending past buf_alloc is reset");
    assert_eq!(g.dev.connection_count(), 0);
}

#[test]
fn guest_shutdown_and_reset() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(8);
    let mut host = g.connect(&listener, 600, 9);
    // Half close: the host reads EOF, can still send.
    let mut shutdown = hdr(OP_SHUTDOWN, 600, 9);
    shutdown.flags = SHUTDOWN_SEND;
    g.send(shutdown, &[]);
    let mut buf = [0u8; 8];
    assert_eq!(host.read(&mut buf).expect("eof"), 0);
    host.write_all(b"still").expect("host writes after guest half-close");
    g.host_event();
    assert_eq!(g.take_rx()[0].1, b"still");
    // Full shutdown: the device answers RST and closes the host socket.
    shutdown.flags = SHUTDOWN_SEND | SHUTDOWN_RCV;
    g.send(shutdown, &[]);
    let packets = g.take_rx();
    assert_eq!(packets.last().map(|(h, _)| h.op), Some(OP_RST));
    assert_eq!(g.dev.connection_count(), 0);

    // RST from the guest closes the host socket at once.
    let mut host = g.connect(&listener, 601, 9);
    g.send(hdr(OP_RST, 601, 9), &[]);
    assert_eq!(host.read(&mut buf).expect("closed"), 0);
    assert_eq!(g.dev.connection_count(), 0);
}

#[test]
fn host_close_is_a_shutdown_to_the_guest() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(8);
    let mut host = g.connect(&listener, 600, 9);
    host.write_all(b"last words").expect("write");
    drop(host);
    g.host_event();
    let packets = g.take_rx();
    assert_eq!(packets[0].1, b"last words");
    let shutdown = packets.iter().find(|(h, _)| h.op == OP_SHUTDOWN).expect("shutdown sent");
    assert_ne!(shutdown.0.flags & SHUTDOWN_SEND, 0);
    // The guest closes its side: RST, connection gone.
    g.send(hdr(OP_RST, 600, 9), &[]);
    assert_eq!(g.dev.connection_count(), 0);
}

#[test]
fn duplicate_request_and_credit_request() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(8);
    let _host = g.connect(&listener, 600, 9);
    g.send(hdr(OP_CREDIT_REQUEST, 600, 9), &[]);
    let packets = g.take_rx();
    assert_eq!(packets[0].0.op, OP_CREDIT_UPDATE);
    assert_eq!(packets[0].0.buf_alloc, BUF_ALLOC);
    g.send(hdr(OP_REQUEST, 600, 9), &[]);
    assert_eq!(g.take_rx()[0].0.op, OP_RST, "REQUEST on a live connection resets it");
    assert_eq!(g.dev.connection_count(), 0);
}

#[test]
fn malformed_tx_packets_are_dropped() {
    let mut g = Guest::new();
    g.give_rx(4);
    // Header split oddly across descriptors is fine.
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    write(&g.mem, TX_BUF, &hdr(OP_REQUEST, 600, 9).encode());
    g.send_chain(&[Buf::r(TX_BUF, 10), Buf::r(TX_BUF + 10, 34)]);
    assert_eq!(g.take_rx()[0].0.op, OP_RESPONSE);
    let (mut host, _) = listener.accept().expect("accept");
    // Short header.
    g.send_chain(&[Buf::r(TX_BUF, 20)]);
    // Declared length larger than the chain.
    let mut lying = hdr(OP_RW, 600, 9);
    lying.len = 1000;
    write(&g.mem, TX_BUF, &lying.encode());
    g.send_chain(&[Buf::r(TX_BUF, 44), Buf::r(TX_BUF + 0x1000, 10)]);
    // Absurd length.
    lying.len = u32::MAX;
    write(&g.mem, TX_BUF, &lying.encode());
    g.send_chain(&[Buf::r(TX_BUF, 44)]);
    // Outside guest memory.
    g.send_chain(&[Buf::r(0xdead_0000_0000, 44)]);
    // Wrong source CID.
    let mut spoofed = hdr(OP_RW, 600, 9);
    spoofed.src_cid = 7;
    g.send(spoofed, b"spoof");
    assert!(g.take_rx().is_empty());
    // The connection is unaffected and nothing reached the host.
    g.send(hdr(OP_RW, 600, 9), b"ok");
    let mut got = [0u8; 2];
    host.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"ok");
}

#[test]
fn reset_drops_connections() {
    let mut g = Guest::new();
    let listener = UnixListener::bind(g.port_path(9)).expect("bind");
    g.give_rx(4);
    let mut host = g.connect(&listener, 600, 9);
    g.dev.reset();
    assert_eq!(g.dev.connection_count(), 0);
    let mut buf = [0u8; 1];
    assert_eq!(host.read(&mut buf).expect("closed"), 0);
}

/// A device with its three queues (rx, tx, event), the event queue's driver side, as a guest
/// that has set the device up.
fn with_event_queue() -> (GuestMemory, DriverQueue, Vec<Queue>, Vsock) {
    let mem = memory();
    let rx = DriverQueue::new(&mem, 0x1_0000, 64);
    let tx = DriverQueue::new(&mem, 0x4_0000, 64);
    let ev = DriverQueue::new(&mem, 0x7_0000, 4);
    let queues = vec![rx.device_queue(), tx.device_queue(), ev.device_queue()];
    let dev = Vsock::new(GUEST_CID, None).expect("vsock");
    (mem, ev, queues, dev)
}

#[test]
fn a_restored_device_resets_the_guest_transport_once() {
    let (mem, mut ev, mut queues, mut dev) = with_event_queue();
    assert_eq!(dev.snapshot_support(), Ok(()));
    // A device that was not restored sends no event.
    write(&mem, 0x8_0000, &[0xff; 4]);
    let first = ev.add_chain(&mem, &[Buf::w(0x8_0000, 4)]);
    dev.process_queue(EVENT_QUEUE, &mut queues, &mem);
    assert!(ev.take_used(&mem).is_empty());
    // Restored: VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (id 0) in the guest's buffer, signalled.
    dev.restored();
    let used = dev.process_queue(EVENT_QUEUE, &mut queues, &mem);
    assert!(used.iter().any(|q| q == EVENT_QUEUE), "the event queue is signalled");
    assert_eq!(ev.take_used(&mem), vec![(u32::from(first), 4)]);
    assert_eq!(read(&mem, 0x8_0000, 4), vec![0, 0, 0, 0]);
    // Once only.
    ev.add_chain(&mem, &[Buf::w(0x8_1000, 4)]);
    dev.process_queue(EVENT_QUEUE, &mut queues, &mem);
    assert!(ev.take_used(&mem).is_empty());
}

#[test]
fn a_reset_pending_until_the_guest_offers_an_event_buffer() {
    let (mem, mut ev, mut queues, mut dev) = with_event_queue();
    dev.restored();
    // No buffer yet (a kick of another queue): nothing, still pending.
    dev.process_queue(RX_QUEUE, &mut queues, &mem);
    // A buffer too small for an event is returned empty; the next one gets it.
    let small = ev.add_chain(&mem, &[Buf::w(0x8_0000, 2)]);
    let good = ev.add_chain(&mem, &[Buf::w(0x8_1000, 4)]);
    dev.process_queue(EVENT_QUEUE, &mut queues, &mem);
    dev.process_queue(EVENT_QUEUE, &mut queues, &mem);
    assert_eq!(ev.take_used(&mem), vec![(u32::from(small), 0), (u32::from(good), 4)]);
}

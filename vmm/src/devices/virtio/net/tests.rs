//! virtio-net driven as a guest driver does (buffers on rx, frames on tx)
//! against the other end of a real SOCK_SEQPACKET socketpair (netd's side).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, setsockopt, socketpair, sockopt, AddressFamily, MsgFlags, SockFlag, SockType};
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_S_LINK_UP};
use virtio_queue::{Queue, QueueT};

use super::{Error, Net, HDR_LEN, QUEUE_SIZE, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::test_utils::{memory, read, write, Buf, DriverQueue};
use crate::devices::virtio::{GuestMemory, VirtioDevice, VIRTIO_F_VERSION_1};

const MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x64];
const MTU: u16 = 65520;
/// Guest buffers start here (the rings sit below).
const BUFS: u64 = 0x10_0000;
/// Far outside the 4 MiB of test guest memory.
const OUTSIDE: u64 = 0x4000_0000;

struct Guest {
    mem: GuestMemory,
    rx: DriverQueue,
    tx: DriverQueue,
    queues: Vec<Queue>,
    dev: Net,
    /// netd's end.
    peer: OwnedFd,
    next_buf: u64,
}

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair")
}

impl Guest {
    fn new(mergeable: bool) -> Self {
        Self::with_mtu(mergeable, MTU)
    }

    fn with_mtu(mergeable: bool, mtu: u16) -> Self {
        Self::build(mergeable, mtu, None)
    }

    /// `sndbuf`: the device end's SO_SNDBUF (what bounds the frames in flight).
    fn build(mergeable: bool, mtu: u16, sndbuf: Option<usize>) -> Self {
        let mem = memory();
        let rx = DriverQueue::new(&mem, 0x1_0000, QUEUE_SIZE);
        let tx = DriverQueue::new(&mem, 0x2_0000, QUEUE_SIZE);
        let queues = vec![rx.device_queue(), tx.device_queue()];
        let (dev_end, peer) = pair();
        if let Some(size) = sndbuf {
            setsockopt(&dev_end, sockopt::SndBuf, &size).expect("SO_SNDBUF");
        }
        let mut dev = Net::new(dev_end, MAC, mtu).expect("net device");
        let mut acked = 1u64 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_NET_F_MTU;
        if mergeable {
            acked |= 1 << VIRTIO_NET_F_MRG_RXBUF;
        }
        dev.ack_features(acked);
        Self { mem, rx, tx, queues, dev, peer, next_buf: BUFS }
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let at = self.next_buf;
        self.next_buf += u64::from(len).next_multiple_of(0x1000);
        at
    }

    /// Posts one device-writable rx buffer of `len` bytes; returns its address.
    fn post_rx(&mut self, len: u32) -> u64 {
        let at = self.alloc(len);
        self.rx.add_chain(&self.mem, &[Buf::w(at, len)]);
        at
    }

    /// Queues `frame` on tx as the Linux driver does (header and frame in one buffer).
    fn send_tx(&mut self, frame: &[u8]) -> u16 {
        let len = (HDR_LEN + frame.len()) as u32;
        let at = self.alloc(len);
        write(&self.mem, at, &[0u8; HDR_LEN]);
        write(&self.mem, at + HDR_LEN as u64, frame);
        self.tx.add_chain(&self.mem, &[Buf::r(at, len)])
    }

    fn kick(&mut self, queue: usize) {
        self.dev.process_queue(queue, &mut self.queues, &self.mem);
    }

    fn event(&mut self) {
        self.dev.handle_event(&mut self.queues, &self.mem);
    }

    /// netd sends a frame.
    fn netd_send(&self, frame: &[u8]) {
        send(self.peer.as_raw_fd(), frame, MsgFlags::empty()).expect("netd send");
    }

    /// netd receives a frame, if one is there.
    fn netd_recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 70_000];
        match recv(self.peer.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => {
                buf.truncate(n);
                Some(buf)
            }
            Err(nix::errno::Errno::EAGAIN) => None,
            Err(e) => panic!("netd recv: {e}"),
        }
    }

    /// Whether the device's event source is ready (the loop would wake).
    fn event_ready(&self) -> bool {
        let fd = self.dev.event_fd().expect("event fd");
        // SAFETY: the fd is the device's epoll fd, open while `self.dev` lives.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).expect("poll") == 1
    }
}

/// A frame of `len` bytes with a recognisable pattern.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn config_and_features() {
    let g = Guest::new(true);
    let mut config = [0u8; 12];
    g.dev.read_config(0, &mut config);
    assert_eq!(&config[0..6], &MAC);
    assert_eq!(u16::from_le_bytes([config[6], config[7]]), VIRTIO_NET_S_LINK_UP as u16);
    assert_eq!(u16::from_le_bytes([config[10], config[11]]), MTU);
    let features = g.dev.features();
    for bit in [VIRTIO_F_VERSION_1, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MTU, VIRTIO_NET_F_MRG_RXBUF] {
        assert_ne!(features & (1 << bit), 0, "feature bit {bit}");
    }
    assert_eq!(g.dev.queue_max_sizes().len(), 2, "rx and tx, no control queue");
}

#[test]
fn refuses_a_stream_socket_and_a_tiny_mtu() {
    let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
    let e = Net::new(a.into(), MAC, MTU).err().expect("stream socket refused");
    assert!(matches!(e, Error::NotSeqpacket(t) if t == libc::SOCK_STREAM), "{e}");
    let (a, _b) = pair();
    assert!(matches!(Net::new(a, MAC, 20), Err(Error::Mtu(20))));
}

#[test]
fn tx_frame_goes_out_without_its_header() {
    let mut g = Guest::new(true);
    let f = frame(1514, 1);
    let head = g.send_tx(&f);
    // A second layout: header and frame in separate descriptors.
    let f2 = frame(60, 2);
    let (h, d) = (g.alloc(HDR_LEN as u32), g.alloc(60));
    write(&g.mem, d, &f2);
    let head2 = g.tx.add_chain(&g.mem, &[Buf::r(h, HDR_LEN as u32), Buf::r(d, 60)]);
    g.kick(TX_QUEUE);
    assert_eq!(g.tx.take_used(&g.mem), vec![(u32::from(head), 0), (u32::from(head2), 0)]);
    assert_eq!(g.netd_recv().as_deref(), Some(&f[..]));
    assert_eq!(g.netd_recv().as_deref(), Some(&f2[..]));
    assert_eq!(g.netd_recv(), None);
    let c = g.dev.counters();
    assert_eq!((c.tx_frames, c.tx_bytes, c.tx_dropped), (2, 1574, 0));
}

#[test]
fn rx_frame_arrives_behind_a_zero_header() {
    let mut g = Guest::new(true);
    let buf = g.post_rx(4096);
    g.kick(RX_QUEUE);
    let f = frame(1514, 3);
    g.netd_send(&f);
    assert!(g.event_ready(), "a frame from netd wakes the device");
    g.event();
    assert_eq!(g.rx.take_used(&g.mem), vec![(0, (HDR_LEN + f.len()) as u32)]);
    let mut want_hdr = [0u8; HDR_LEN];
    want_hdr[10] = 1; // num_buffers
    assert_eq!(read(&g.mem, buf, HDR_LEN), want_hdr);
    assert_eq!(read(&g.mem, buf + HDR_LEN as u64, f.len()), f);
    assert_eq!(g.dev.counters().rx_frames, 1);
}

#[test]
fn rx_large_frame_spans_mergeable_buffers() {
    let mut g = Guest::new(true);
    let bufs: Vec<u64> = (0..4).map(|_| g.post_rx(4096)).collect();
    let f = frame(9000, 4);
    g.netd_send(&f);
    g.event();
    let used = g.rx.take_used(&g.mem);
    let total = HDR_LEN + f.len();
    assert_eq!(used, vec![(0, 4096), (1, 4096), (2, (total - 8192) as u32)], "three buffers, the fourth left");
    assert_eq!(u16::from_le_bytes([read(&g.mem, bufs[0] + 10, 2)[0], read(&g.mem, bufs[0] + 10, 2)[1]]), 3);
    let mut got = read(&g.mem, bufs[0] + HDR_LEN as u64, 4096 - HDR_LEN);
    got.extend(read(&g.mem, bufs[1], 4096));
    got.extend(read(&g.mem, bufs[2], total - 8192));
    assert_eq!(got, f);
    // The fourth buffer takes the next frame.
    g.netd_send(&frame(100, 5));
    g.event();
    assert_eq!(g.rx.take_used(&g.mem), vec![(3, (HDR_LEN + 100) as u32)]);
}

#[test]
fn rx_frame_waits_until_enough_buffers_are_posted() {
    let mut g = Guest::new(true);
    let f = frame(9000, 6);
    g.netd_send(&f);
    g.event();
    assert!(g.rx.take_used(&g.mem).is_empty(), "no buffers: nothing used");
    assert!(!g.event_ready(), "a waiting frame stops the device reading the socket");
    g.post_rx(4096);
    g.kick(RX_QUEUE);
    assert!(g.rx.take_used(&g.mem).is_empty(), "one buffer is not enough: it is put back");
    g.post_rx(4096);
    g.post_rx(4096);
    g.kick(RX_QUEUE);
    assert_eq!(g.rx.take_used(&g.mem).len(), 3, "the frame in the three buffers");
    assert_eq!(g.dev.counters().rx_frames, 1);
    assert_eq!(g.dev.counters().rx_dropped, 0);
}

#[test]
fn rx_large_frame_without_mrg_rxbuf_is_dropped_and_the_buffer_kept() {
    let mut g = Guest::new(false);
    let buf = g.post_rx(1526);
    g.netd_send(&frame(9000, 7));
    let small = frame(1000, 8);
    g.netd_send(&small);
    g.event();
    assert_eq!(g.rx.take_used(&g.mem), vec![(0, (HDR_LEN + small.len()) as u32)], "the small frame got the buffer");
    assert_eq!(read(&g.mem, buf + HDR_LEN as u64, small.len()), small);
    let c = g.dev.counters();
    assert_eq!((c.rx_frames, c.rx_dropped), (1, 1));
}

#[test]
fn rx_frame_larger_than_the_mtu_is_dropped() {
    let mut g = Guest::with_mtu(true, 1500);
    for _ in 0..8 {
        g.post_rx(4096);
    }
    g.netd_send(&frame(1500 + 18 + 1, 9));
    // Larger than the device's buffer: the socket truncates, the length tells.
    g.netd_send(&frame(9000, 19));
    g.netd_send(&frame(1518, 10));
    g.event();
    assert_eq!(g.rx.take_used(&g.mem), vec![(0, (HDR_LEN + 1518) as u32)]);
    assert_eq!(g.dev.counters().rx_dropped, 2);
}

#[test]
fn tx_frame_larger_than_the_mtu_is_dropped() {
    let mut g = Guest::with_mtu(true, 1500);
    g.send_tx(&frame(4000, 11));
    let ok = frame(1514, 12);
    g.send_tx(&ok);
    g.kick(TX_QUEUE);
    assert_eq!(g.tx.take_used(&g.mem).len(), 2, "both chains returned");
    assert_eq!(g.netd_recv().as_deref(), Some(&ok[..]));
    assert_eq!(g.netd_recv(), None);
    assert_eq!(g.dev.counters().tx_dropped, 1);
}

#[test]
fn malformed_tx_chains_are_returned_and_counted() {
    let mut g = Guest::new(true);
    // Outside guest memory.
    let bad = g.tx.add_chain(&g.mem, &[Buf::r(OUTSIDE, 100)]);
    // Shorter than the header.
    let at = g.alloc(8);
    let short = g.tx.add_chain(&g.mem, &[Buf::r(at, 8)]);
    // Only device-writable buffers: no frame at all.
    let at = g.alloc(64);
    let writable = g.tx.add_chain(&g.mem, &[Buf::w(at, 64)]);
    let f = frame(200, 13);
    let good = g.send_tx(&f);
    g.kick(TX_QUEUE);
    let used: Vec<u32> = g.tx.take_used(&g.mem).into_iter().map(|(id, _)| id).collect();
    assert_eq!(used, vec![u32::from(bad), u32::from(short), u32::from(writable), u32::from(good)]);
    assert_eq!(g.netd_recv().as_deref(), Some(&f[..]), "the good frame still goes out");
    let c = g.dev.counters();
    assert_eq!((c.tx_frames, c.tx_dropped, c.bad_chains), (1, 3, 3));
}

#[test]
fn malformed_rx_chains_are_returned_and_counted() {
    let mut g = Guest::new(true);
    g.rx.add_chain(&g.mem, &[Buf::w(OUTSIDE, 4096)]);
    let at = g.alloc(4096);
    g.rx.add_chain(&g.mem, &[Buf::r(at, 4096)]);
    let buf = g.post_rx(4096);
    let f = frame(300, 14);
    g.netd_send(&f);
    g.event();
    assert_eq!(g.rx.take_used(&g.mem), vec![(0, 0), (1, 0), (2, (HDR_LEN + f.len()) as u32)]);
    assert_eq!(read(&g.mem, buf + HDR_LEN as u64, f.len()), f);
    let c = g.dev.counters();
    assert_eq!((c.rx_frames, c.bad_chains), (1, 2));
}

#[test]
fn a_malformed_chain_inside_a_mergeable_frame_drops_it_without_losing_buffers() {
    let mut g = Guest::new(true);
    g.post_rx(4096);
    g.rx.add_chain(&g.mem, &[Buf::w(OUTSIDE, 4096)]);
    g.post_rx(4096);
    g.post_rx(4096);
    g.netd_send(&frame(6000, 15));
    let f = frame(500, 16);
    g.netd_send(&f);
    g.event();
    // The first frame took buffer 0, met the bad chain 1: both returned
    // empty, the frame dropped; the next frame lands in buffer 2.
    assert_eq!(g.rx.take_used(&g.mem), vec![(1, 0), (0, 0), (2, (HDR_LEN + f.len()) as u32)]);
    let c = g.dev.counters();
    assert_eq!((c.rx_frames, c.rx_dropped, c.bad_chains), (1, 1, 1));
}

#[test]
fn backpressure_when_netd_does_not_read() {
    // A small socket buffer, so a few frames netd has not read fill it.
    let mut g = Guest::build(true, MTU, Some(16 * 1024));
    let frames: Vec<Vec<u8>> = (0..64).map(|i| frame(1514, i as u8)).collect();
    for f in &frames {
        g.send_tx(f);
    }
    g.kick(TX_QUEUE);
    let first = g.tx.take_used(&g.mem).len();
    assert!(first < frames.len(), "the device stopped taking chains ({first} of {})", frames.len());
    assert!(first > 0, "some frames went out");
    assert!(!g.event_ready(), "while the socket is full the device has nothing to do");
    // Kicks while the socket is full take nothing more.
    g.kick(TX_QUEUE);
    assert!(g.tx.take_used(&g.mem).is_empty());
    // netd reads; the device resumes from where it stopped, in order.
    let mut got = Vec::new();
    let mut rounds = 0;
    while got.len() < frames.len() {
        while let Some(f) = g.netd_recv() {
            got.push(f);
        }
        if got.len() < frames.len() {
            assert!(g.event_ready(), "room in the socket wakes the device");
        }
        g.event();
        rounds += 1;
        assert!(rounds < 1000, "tx never drained: {} of {} frames", got.len(), frames.len());
    }
    assert_eq!(got, frames);
    assert_eq!(first + g.tx.take_used(&g.mem).len(), frames.len());
    assert!(!g.event_ready(), "nothing left to wait for");
    assert_eq!(g.dev.counters().tx_dropped, 0);
}

#[test]
fn netd_going_away_takes_the_link_down_without_spinning() {
    let mut g = Guest::new(true);
    g.post_rx(4096);
    let peer = std::mem::replace(&mut g.peer, pair().0);
    drop(peer);
    assert!(g.event_ready());
    g.event();
    assert!(!g.dev.link_up());
    assert!(!g.event_ready(), "a dead link is out of the device's event set");
    g.send_tx(&frame(100, 17));
    g.kick(TX_QUEUE);
    assert_eq!(g.tx.take_used(&g.mem).len(), 1, "the guest's frames are still taken");
    assert_eq!(g.dev.counters().tx_dropped, 1);
}

#[test]
fn a_frame_before_the_rx_ring_is_ready_waits_without_spinning() {
    let mut g = Guest::new(true);
    g.queues[RX_QUEUE].set_ready(false);
    g.netd_send(&frame(100, 18));
    g.event();
    assert!(!g.event_ready(), "the frame is held: the device does not wake for the socket again");
    g.queues[RX_QUEUE].set_ready(true);
    g.post_rx(4096);
    g.kick(RX_QUEUE);
    assert_eq!(g.rx.take_used(&g.mem), vec![(0, (HDR_LEN + 100) as u32)]);
}

/// A snapshot of the device goes through its transport: a clone's device on a new link (its
/// own netd) continues the guest's rings where the source left them; the source's link sees
/// nothing of the clone.
#[test]
fn a_restored_device_continues_the_rings_on_its_new_link() {
    use crate::devices::virtio::mmio::regs::{STATUS, STATUS_DRIVER_OK};
    use crate::devices::virtio::mmio::tests::{negotiate, setup_queue, wr, OK};
    use crate::devices::virtio::mmio::MmioTransport;
    use vm_memory::GuestMemoryAtomic;

    let mem = memory();
    let (dev_end, peer) = pair();
    let dev = Net::new(dev_end, MAC, MTU).expect("net device");
    assert_eq!(dev.snapshot_support(), Ok(()));
    let mut t = MmioTransport::new(Box::new(dev), GuestMemoryAtomic::new(mem.clone())).expect("transport");
    let features = 1u64 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_NET_F_MTU;
    assert_eq!(negotiate(&mut t, features), OK);
    let mut rx = DriverQueue::new(&mem, 0x1_0000, QUEUE_SIZE);
    let mut tx = DriverQueue::new(&mem, 0x2_0000, QUEUE_SIZE);
    setup_queue(&mut t, RX_QUEUE as u32, &rx);
    setup_queue(&mut t, TX_QUEUE as u32, &tx);
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    let bufs = [BUFS, BUFS + 0x1_0000, BUFS + 0x2_0000];
    for b in bufs {
        rx.add_chain(&mem, &[Buf::w(b, 0x1_0000)]);
    }
    t.cell().lock().expect("cell").process_queue(RX_QUEUE);
    let first = frame(100, 1);
    send(peer.as_raw_fd(), &first, MsgFlags::empty()).expect("netd send");
    t.cell().lock().expect("cell").handle_event();
    assert_eq!(rx.take_used(&mem), vec![(0, (HDR_LEN + first.len()) as u32)]);

    let state = t.save_state().expect("a net transport saves");
    let state = serde_json::from_slice(&serde_json::to_vec(&state).expect("encode")).expect("decode");
    let (clone_end, clone_peer) = pair();
    let clone = Net::new(clone_end, MAC, MTU).expect("net device");
    let r = MmioTransport::restore(Box::new(clone), GuestMemoryAtomic::new(mem.clone()), &state).expect("restore");
    // The clone's netd delivers into the next posted buffer (descriptor 1).
    let second = frame(200, 2);
    send(clone_peer.as_raw_fd(), &second, MsgFlags::empty()).expect("clone netd send");
    r.cell().lock().expect("cell").process_queue(RX_QUEUE);
    r.cell().lock().expect("cell").handle_event();
    assert_eq!(rx.take_used(&mem), vec![(1, (HDR_LEN + second.len()) as u32)]);
    assert_eq!(read(&mem, bufs[1] + HDR_LEN as u64, second.len()), second);
    // The guest's next frame leaves on the clone's link only.
    let out = frame(60, 3);
    let at = BUFS + 0x4_0000;
    write(&mem, at, &[0u8; HDR_LEN]);
    write(&mem, at + HDR_LEN as u64, &out);
    let head = tx.add_chain(&mem, &[Buf::r(at, (HDR_LEN + out.len()) as u32)]);
    r.cell().lock().expect("cell").process_queue(TX_QUEUE);
    assert_eq!(tx.take_used(&mem), vec![(u32::from(head), 0)]);
    let mut got = vec![0u8; 70_000];
    let n = recv(clone_peer.as_raw_fd(), &mut got, MsgFlags::MSG_DONTWAIT).expect("the clone's netd gets the frame");
    assert_eq!(&got[..n], &out[..]);
    assert_eq!(recv(peer.as_raw_fd(), &mut got, MsgFlags::MSG_DONTWAIT), Err(nix::errno::Errno::EAGAIN));
}

//! The whole path on a real device thread: virtio-blk, virtio-vsock and
//! virtio-net behind virtio-mmio transports, a guest driving their registers and
//! rings from this thread, interrupts through the irqfds.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use vm_memory::GuestMemoryAtomic;

use super::EventLoop;
use crate::bus::BusDevice;
use crate::devices::virtio::block::{Block, FileBackend};
use crate::devices::virtio::mmio::regs::*;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::{memory, read, write, Buf, DriverQueue};
use crate::devices::virtio::vsock::packet::*;
use crate::devices::virtio::vsock::{Vsock, HOST_CID, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::{GuestMemory, VIRTIO_F_VERSION_1};

fn wr(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

fn rd(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

/// The Linux driver's bring-up: features, queues, DRIVER_OK.
fn bring_up(t: &mut MmioTransport, queues: &[&DriverQueue]) {
    wr(t, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    wr(t, DEVICE_FEATURES_SEL, 1);
    let high = rd(t, DEVICE_FEATURES);
    assert_ne!(high & 1 << (VIRTIO_F_VERSION_1 - 32), 0);
    wr(t, DRIVER_FEATURES_SEL, 1);
    wr(t, DRIVER_FEATURES, 1 << (VIRTIO_F_VERSION_1 - 32));
    let ok = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
    wr(t, STATUS, ok);
    for (i, q) in queues.iter().enumerate() {
        wr(t, QUEUE_SEL, i as u32);
        assert!(rd(t, QUEUE_NUM_MAX) >= u32::from(q.size));
        wr(t, QUEUE_NUM, u32::from(q.size));
        wr(t, QUEUE_DESC_LOW, q.desc as u32);
        wr(t, QUEUE_DRIVER_LOW, q.avail as u32);
        wr(t, QUEUE_DEVICE_LOW, q.used as u32);
        wr(t, QUEUE_READY, 1);
    }
    wr(t, STATUS, ok | STATUS_DRIVER_OK);
    assert_eq!(rd(t, STATUS), ok | STATUS_DRIVER_OK);
}

/// Waits for the device's interrupt, then acks it as the driver does.
fn wait_irq(t: &mut MmioTransport) {
    let irq = t.interrupt().irq_fd().try_clone().expect("irqfd");
    // SAFETY: `irq` owns the fd and outlives the borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(irq.as_raw_fd()) };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    assert_eq!(poll(&mut fds, PollTimeout::from(10_000u16)).expect("poll"), 1, "no interrupt (10 s hang guard)");
    irq.read().expect("irqfd");
    let status = rd(t, INTERRUPT_STATUS);
    assert_ne!(status & INT_USED_BUFFER, 0);
    wr(t, INTERRUPT_ACK, status);
}

fn rx_packets(mem: &GuestMemory, rx: &mut DriverQueue, base: u64) -> Vec<(Header, Vec<u8>)> {
    rx.take_used(mem)
        .into_iter()
        .map(|(id, _)| {
            let addr = base + u64::from(id) * 0x2000;
            let h = Header::decode(read(mem, addr, HEADER_LEN).as_slice().try_into().expect("header"));
            (h, read(mem, addr + HEADER_LEN as u64, h.len as usize))
        })
        .collect()
}

#[test]
fn blk_and_vsock_on_the_device_thread() {
    let mem = memory();
    let atomic = GuestMemoryAtomic::new(mem.clone());
    let dir = tempfile::tempdir().expect("tempdir");

    let disk_path = dir.path().join("disk");
    std::fs::write(&disk_path, vec![0x5a; 64 * 1024]).expect("disk");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&disk_path).expect("open");
    let blk = Block::new(Arc::new(FileBackend::new(file, false).expect("backend")), "disk");
    let mut blk_t = MmioTransport::new(Box::new(blk), atomic.clone()).expect("blk transport");
    let mut blk_q = DriverQueue::new(&mem, 0x1_0000, 16);
    bring_up(&mut blk_t, &[&blk_q]);

    let uds = dir.path().join("v.sock");
    let vsock = Vsock::new(3, Some(uds.clone())).expect("vsock");
    let handle = vsock.handle();
    let mut vs_t = MmioTransport::new(Box::new(vsock), atomic).expect("vsock transport");
    let mut rx = DriverQueue::new(&mem, 0x4_0000, 32);
    let mut tx = DriverQueue::new(&mem, 0x6_0000, 32);
    let ev = DriverQueue::new(&mem, 0x8_0000, 4);
    bring_up(&mut vs_t, &[&rx, &tx, &ev]);

    let mut event_loop = EventLoop::new().expect("event loop");
    event_loop.add(&blk_t).expect("add blk");
    event_loop.add(&vs_t).expect("add vsock");
    let exit = event_loop.exit_evt().expect("exit");
    let thread =
        std::thread::Builder::new().name("virtio-dev".into()).spawn(move || event_loop.run()).expect("device thread");

    // virtio-blk: write a sector, read it back.
    let hdr = |kind: u32, sector: u64| {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        h
    };
    write(&mem, 0x10_0000, &hdr(VIRTIO_BLK_T_OUT, 4));
    write(&mem, 0x11_0000, &[0x77; 512]);
    blk_q.add_chain(&mem, &[Buf::r(0x10_0000, 16), Buf::r(0x11_0000, 512), Buf::w(0x10_0100, 1)]);
    wr(&mut blk_t, QUEUE_NOTIFY, 0);
    wait_irq(&mut blk_t);
    assert_eq!(blk_q.take_used(&mem).len(), 1);
    assert_eq!(read(&mem, 0x10_0100, 1)[0], VIRTIO_BLK_S_OK as u8);
    write(&mem, 0x10_0000, &hdr(VIRTIO_BLK_T_IN, 3));
    blk_q.add_chain(&mem, &[Buf::r(0x10_0000, 16), Buf::w(0x12_0000, 1024), Buf::w(0x10_0100, 1)]);
    // Through the queue's eventfd, as a KVM ioeventfd delivers it.
    blk_t.queue_evts()[0].write(1).expect("ioeventfd");
    wait_irq(&mut blk_t);
    assert_eq!(blk_q.take_used(&mem), vec![(3, 1025)]);
    let data = read(&mem, 0x12_0000, 1024);
    assert!(data[..512].iter().all(|b| *b == 0x5a) && data[512..].iter().all(|b| *b == 0x77));

    // virtio-vsock: rx buffers, a guest connect, data both ways.
    const RX_BASE: u64 = 0x20_0000;
    for i in 0..16u64 {
        rx.add_chain(&mem, &[Buf::w(RX_BASE + i * 0x2000, 44 + 4096)]);
    }
    wr(&mut vs_t, QUEUE_NOTIFY, RX_QUEUE as u32);
    let mut port_path = uds.clone().into_os_string();
    port_path.push("_80");
    let listener = UnixListener::bind(std::path::PathBuf::from(port_path)).expect("bind");
    let send = |tx: &mut DriverQueue, t: &mut MmioTransport, h: Header, payload: &[u8]| {
        let mut h = h;
        h.len = payload.len() as u32;
        write(&mem, 0x30_0000, &h.encode());
        write(&mem, 0x30_1000, payload);
        let mut chain = vec![Buf::r(0x30_0000, 44)];
        if !payload.is_empty() {
            chain.push(Buf::r(0x30_1000, payload.len() as u32));
        }
        tx.add_chain(&mem, &chain);
        wr(t, QUEUE_NOTIFY, TX_QUEUE as u32);
    };
    let guest = |op, src_port, dst_port| Header {
        src_cid: 3,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        kind: TYPE_STREAM,
        op,
        buf_alloc: 65536,
        ..Header::default()
    };
    send(&mut tx, &mut vs_t, guest(OP_REQUEST, 4000, 80), &[]);
    wait_irq(&mut vs_t);
    let mut packets = rx_packets(&mem, &mut rx, RX_BASE);
    while packets.is_empty() {
        wait_irq(&mut vs_t);
        packets = rx_packets(&mem, &mut rx, RX_BASE);
    }
    assert_eq!(packets[0].0.op, OP_RESPONSE);
    let (mut host, _) = listener.accept().expect("accept");
    send(&mut tx, &mut vs_t, guest(OP_RW, 4000, 80), b"to host");
    let mut got = [0u8; 7];
    host.read_exact(&mut got).expect("host reads");
    assert_eq!(&got, b"to host");
    host.write_all(b"to guest").expect("host writes");
    let mut packets = Vec::new();
    while packets.is_empty() {
        wait_irq(&mut vs_t);
        packets = rx_packets(&mem, &mut rx, RX_BASE);
    }
    assert_eq!(packets[0].1, b"to guest");

    // In-process connect from another thread; the guest accepts.
    let connector = std::thread::spawn(move || handle.connect(1024, Duration::from_secs(30)));
    let mut packets = Vec::new();
    while packets.is_empty() {
        wait_irq(&mut vs_t);
        packets = rx_packets(&mem, &mut rx, RX_BASE);
    }
    let request = packets[0].0;
    assert_eq!((request.op, request.dst_port), (OP_REQUEST, 1024));
    send(&mut tx, &mut vs_t, guest(OP_RESPONSE, 1024, request.src_port), &[]);
    let mut agent = connector.join().expect("thread").expect("connected");
    send(&mut tx, &mut vs_t, guest(OP_RW, 1024, request.src_port), b"agent says hi");
    let mut got = [0u8; 13];
    agent.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"agent says hi");

    exit.write(1).expect("exit");
    thread.join().expect("device thread").expect("event loop");
}

#[test]
fn net_on_the_device_thread_under_its_seccomp_filter() {
    use crate::devices::virtio::net::{Net, HDR_LEN, RX_QUEUE as NET_RX, TX_QUEUE as NET_TX};
    use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

    let mem = memory();
    let atomic = GuestMemoryAtomic::new(mem.clone());
    let (dev_end, netd) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair");
    let net = Net::new(dev_end, [2, 0, 0, 0, 0, 1], 1500).expect("net");
    let mut t = MmioTransport::new(Box::new(net), atomic).expect("net transport");
    let mut rx = DriverQueue::new(&mem, 0x1_0000, 16);
    let mut tx = DriverQueue::new(&mem, 0x3_0000, 16);
    bring_up(&mut t, &[&rx, &tx]);
    let mut event_loop = EventLoop::new().expect("event loop");
    event_loop.add(&t).expect("add net");
    // The production path: the thread installs the vmm_device filter (a
    // syscall outside it kills this test process).
    let thread = event_loop.spawn("virtio-net-dev").expect("device thread");

    // netd -> guest.
    rx.add_chain(&mem, &[Buf::w(0x10_0000, 2048)]);
    wr(&mut t, QUEUE_NOTIFY, NET_RX as u32);
    let frame: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
    send(netd.as_raw_fd(), &frame, MsgFlags::empty()).expect("netd send");
    wait_irq(&mut t);
    assert_eq!(rx.take_used(&mem), vec![(0, (HDR_LEN + frame.len()) as u32)]);
    assert_eq!(read(&mem, 0x10_0000 + HDR_LEN as u64, frame.len()), frame);

    // guest -> netd, through the queue's eventfd as a KVM ioeventfd delivers it.
    write(&mem, 0x20_0000, &[0u8; HDR_LEN]);
    write(&mem, 0x20_0000 + HDR_LEN as u64, b"frame from the guest");
    tx.add_chain(&mem, &[Buf::r(0x20_0000, (HDR_LEN + 20) as u32)]);
    t.queue_evts()[NET_TX].write(1).expect("ioeventfd");
    let mut buf = [0u8; 2048];
    let n = recv(netd.as_raw_fd(), &mut buf, MsgFlags::empty()).expect("netd recv");
    assert_eq!(&buf[..n], b"frame from the guest");
    wait_irq(&mut t);
    assert_eq!(tx.take_used(&mem).len(), 1);

    thread.stop().expect("device thread ends cleanly");
}

//! Test guests driving the virtio devices on this host's KVM, as in production: each device
//! behind a virtio-mmio transport, queue notifications through ioeventfds, interrupts through
//! irqfds, the queues served by the device thread of [`EventLoop::spawn`] under the
//! `vmm_device` seccomp filter while the vCPU runs under the `vcpu` filter.
//!
//! * discovery and feature negotiation (`virtio_features.S`), accepted and refused;
//! * virtio-blk reading an image's erofs view, and refusing a write (`virtio_blk.S`);
//! * virtio-vsock: a guest stream to a host Unix socket both ways, then its end (`virtio_vsock.S`);
//! * a syscall outside the device filter, made on the device thread, kills the process.
//!
//! [`EventLoop::spawn`]: pvisor_vmm::devices::virtio::event_loop::EventLoop::spawn

mod common;

use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use common::erofs_disk::{blob, image_views};
use common::virtio::{attach, run};
use pvisor_vmm::devices::virtio::block::{Block, BlockBackend, FileBackend, ReadOnlyBackend};
use pvisor_vmm::devices::virtio::mmio::regs::{
    INT_USED_BUFFER, MAGIC_VALUE, STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FEATURES_OK, VERSION,
};
use pvisor_vmm::devices::virtio::vsock::packet::{OP_RESPONSE, OP_RST};
use pvisor_vmm::devices::virtio::vsock::Vsock;
use pvisor_vmm::devices::virtio::{GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1};
use pvisor_vmm::VmExit;
use virtio_queue::Queue;

/// A 64 KiB read-write disk in a temporary file.
fn scratch_disk(dir: &tempfile::TempDir) -> Arc<dyn BlockBackend> {
    let path = dir.path().join("disk");
    std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    Arc::new(FileBackend::new(file, false).unwrap())
}

// --- discovery and feature negotiation ---------------------------------------------------

const DISCOVERY_EXIT: VmExit = VmExit::DebugExit(0x21);
const NEGOTIATING: u32 = STATUS_ACKNOWLEDGE | STATUS_DRIVER;
const FEATURES_OK: u32 = NEGOTIATING | STATUS_FEATURES_OK;

/// Runs `virtio_features.S` against `device` with the driver's high feature word `ack_high`.
fn negotiate(device: Box<dyn VirtioDevice>, ack_high: u32) -> Vec<u32> {
    let r = run(&common::guest("virtio_features"), ack_high, |b, l| {
        attach(b, l, device);
    });
    assert_eq!(r.exit, DISCOVERY_EXIT, "console {:?}, reports {:?}", r.console, r.reports);
    r.reports
}

#[test]
fn a_driver_finds_the_device_and_negotiates_version_1() {
    let dir = tempfile::tempdir().unwrap();
    let block = Block::new(scratch_disk(&dir), "scratch");
    let offered = block.features();
    assert_ne!(offered & 1 << VIRTIO_F_VERSION_1, 0);
    let reports = negotiate(Box::new(block), 1 << (VIRTIO_F_VERSION_1 - 32));
    assert_eq!(
        reports,
        [MAGIC_VALUE, VERSION, 2, offered as u32, (offered >> 32) as u32, FEATURES_OK, FEATURES_OK | STATUS_DRIVER_OK],
        "magic, version, device id (2: block), device features low/high, status after FEATURES_OK and DRIVER_OK"
    );

    let vsock = Vsock::new(3, None).unwrap();
    let reports = negotiate(Box::new(vsock), 1 << (VIRTIO_F_VERSION_1 - 32));
    assert_eq!(reports[..3], [MAGIC_VALUE, VERSION, 19], "device id 19: vsock");
    assert_eq!(reports[5..], [FEATURES_OK, FEATURES_OK | STATUS_DRIVER_OK]);
}

#[test]
fn a_driver_refusing_version_1_gets_neither_features_ok_nor_driver_ok() {
    let dir = tempfile::tempdir().unwrap();
    let block = Block::new(scratch_disk(&dir), "scratch");
    let reports = negotiate(Box::new(block), 0);
    assert_eq!(reports.len(), 7);
    assert_eq!(reports[..3], [MAGIC_VALUE, VERSION, 2]);
    assert_eq!(reports[5..], [NEGOTIATING, NEGOTIATING], "FEATURES_OK refused, so DRIVER_OK too");
}

// --- virtio-blk over an image's erofs view ------------------------------------------------

/// Addresses in `virtio_blk.S`.
const BLK_USED: u64 = 0x20_2000;
const BLK_STATUS: u64 = 0x20_3100;
const BLK_DATA0: u64 = 0x21_0000;
const BLK_DATA1: u64 = 0x21_2000;
const BLK_EXIT: VmExit = VmExit::DebugExit(0x30);
const EROFS_MAGIC: u32 = 0xE0F5_E1E2;
const SECTOR: u64 = 512;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

/// The first sector of the image that holds `/data/blob`'s data, plus 3: a sector read
/// from the pool's chunks, past the metadata.
fn blob_sector(view: &pvisor_images::erofs::ErofsView) -> u64 {
    let first = &blob()[..SECTOR as usize];
    let mut buf = vec![0u8; SECTOR as usize];
    (0..view.len() / SECTOR)
        .find(|s| {
            assert_eq!(view.read_at(s * SECTOR, &mut buf).unwrap(), buf.len());
            buf == first
        })
        .expect("the blob's data is in the image")
        + 3
}

#[test]
fn virtio_blk_reads_the_erofs_view_of_an_image_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let views = image_views(dir.path());
    let view = &views.check;
    let sector = blob_sector(view);
    let image = views.disk;
    let disk = Block::new(Arc::new(ReadOnlyBackend::new(image.len(), move |o, b| image.read_at(o, b))), "rootfs");
    let r = run(&common::guest("virtio_blk"), u32::try_from(sector).unwrap(), |b, l| {
        attach(b, l, Box::new(disk));
    });
    assert_eq!(r.exit, BLK_EXIT, "console {:?}, reports {:?}", r.console, r.reports);

    // All four requests came back, in order, with their used lengths (data + status byte).
    assert_eq!(r.u16_at(BLK_USED + 2), 4, "used idx");
    let used: Vec<(u32, u32)> =
        (0..4).map(|i| (r.u32_at(BLK_USED + 4 + 8 * i), r.u32_at(BLK_USED + 8 + 8 * i))).collect();
    assert_eq!(used, [(0, 4096 + 1), (3, 512 + 1), (6, 1), (9, 1)]);
    assert_eq!(
        r.read(BLK_STATUS, 4),
        [S_OK, S_OK, S_IOERR, S_UNSUPP],
        "IN ok, IN ok, OUT to the read-only disk IOERR, DISCARD (not offered) UNSUPP"
    );
    assert_eq!(r.reports, [INT_USED_BUFFER, 0], "InterruptStatus had USED_BUFFER, acked to 0");

    let mut expected = vec![0u8; 4096];
    assert_eq!(view.read_at(0, &mut expected).unwrap(), 4096);
    let data0 = r.read(BLK_DATA0, 4096);
    assert!(data0 == expected, "sectors 0..8 differ from ErofsView::read_at");
    assert_eq!(u32::from_le_bytes(data0[1024..1028].try_into().unwrap()), EROFS_MAGIC, "erofs superblock");

    let mut expected = vec![0u8; 512];
    assert_eq!(view.read_at(sector * SECTOR, &mut expected).unwrap(), 512);
    let data1 = r.read(BLK_DATA1, 512);
    assert!(data1 == expected, "sector {sector} differs from ErofsView::read_at");
    assert!(data1 == blob()[3 * 512..4 * 512], "sector {sector} is not /data/blob's fourth");
}

// --- virtio-vsock --------------------------------------------------------------------------

const VSOCK_EXIT: VmExit = VmExit::DebugExit(0x40);
const HOST_PORT: u32 = 5000;

#[test]
fn virtio_vsock_guest_stream_to_a_host_socket_both_ways_then_reset() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let listener = UnixListener::bind(format!("{}_{HOST_PORT}", uds.display())).unwrap();
    let host = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // A hang guard, should the guest stop talking; not a timing check.
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = vec![0u8; b"hello from the guest".len()];
        stream.read_exact(&mut got).unwrap();
        stream.write_all(b"hi guest").unwrap();
        let mut rest = Vec::new();
        let eof = stream.read_to_end(&mut rest).map(|_| rest);
        (got, eof)
    });
    let vsock = Vsock::new(3, Some(uds)).unwrap();
    let r = run(&common::guest("virtio_vsock"), HOST_PORT, |b, l| {
        attach(b, l, Box::new(vsock));
    });
    assert_eq!(r.exit, VSOCK_EXIT, "console {:?}, reports {:?}", r.console, r.reports);
    assert_eq!(
        r.reports,
        [3, u32::from(OP_RESPONSE), u32::from(OP_RST)],
        "guest CID, answer to REQUEST, answer to SHUTDOWN"
    );
    assert_eq!(r.console, "hi guest", "the host's reply reached the guest");
    let (got, eof) = host.join().unwrap();
    assert_eq!(got, b"hello from the guest");
    assert_eq!(eof.expect("the host socket ends with EOF once the guest shut down"), b"");
}

// --- the device thread's seccomp filter -------------------------------------------------------

const PROBE_ENV: &str = "PVISOR_VGUESTS_DEVICE_PROBE";

/// A block device that makes the probe's syscall on the device thread before serving a queue.
struct SyscallProbe {
    inner: Block,
    syscall: String,
}

impl SyscallProbe {
    fn call(&self) {
        println!("device probe on {:?}: calling {}", std::thread::current().name(), self.syscall);
        // SAFETY: raw syscalls with constant arguments and 'static C strings; each fails or
        // returns an fd that is left open (the probes expect the filter to kill first).
        let ret = unsafe {
            match self.syscall.as_str() {
                "inet" => libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0),
                "openat" => libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY),
                "none" => 0,
                other => panic!("unknown probe {other}"),
            }
        };
        println!("probe returned {ret}");
    }
}

impl VirtioDevice for SyscallProbe {
    fn device_type(&self) -> u32 {
        self.inner.device_type()
    }
    fn features(&self) -> u64 {
        self.inner.features()
    }
    fn ack_features(&mut self, features: u64) {
        self.inner.ack_features(features)
    }
    fn queue_max_sizes(&self) -> &[u16] {
        self.inner.queue_max_sizes()
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.inner.read_config(offset, data)
    }
    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        self.call();
        self.inner.process_queue(index, queues, mem)
    }
    fn event_fd(&self) -> Option<RawFd> {
        self.inner.event_fd()
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
}

#[test]
#[ignore = "helper of the device_filter_* tests: runs only in their child process"]
fn device_probe_child() {
    let syscall = std::env::var(PROBE_ENV).expect("run by the device_filter_* tests with the probe set");
    let dir = tempfile::tempdir().unwrap();
    let probe = SyscallProbe { inner: Block::new(scratch_disk(&dir), "scratch"), syscall };
    let r = run(&common::guest("virtio_blk"), 1, |b, l| {
        attach(b, l, Box::new(probe));
    });
    println!("exit {:?} console {:?}", r.exit, r.console);
    assert_eq!(r.exit, BLK_EXIT);
    assert_eq!(r.read(BLK_STATUS, 4), [S_OK; 4], "the scratch disk takes the write and the discard (fallocate)");
    let disk = std::fs::read(dir.path().join("disk")).unwrap();
    assert_eq!(disk[..512], [0xa5; 512], "sector 0 written");
    assert!(disk[4096..8192].iter().all(|b| *b == 0), "sectors 8..16 discarded");
    assert!(disk[8192..].iter().all(|b| *b == 0x5a), "the rest untouched");
    println!("child done");
}

fn run_probe(syscall: &str) -> (std::process::ExitStatus, String) {
    common::require_kvm();
    common::run_child("device_probe_child", PROBE_ENV, syscall)
}

#[test]
fn device_filter_lets_the_block_guest_through() {
    let (status, stdout) = run_probe("none");
    assert!(status.success(), "control probe failed: {status}");
    assert!(stdout.contains("device probe on Some(\"virtio-dev\"): calling none"));
    assert!(stdout.contains("probe returned 0") && stdout.contains("child done"));
}

#[test]
fn device_filter_kills_a_denied_syscall_on_the_device_thread() {
    for syscall in ["inet", "openat"] {
        let (status, stdout) = run_probe(syscall);
        assert!(
            stdout.contains(&format!("device probe on Some(\"virtio-dev\"): calling {syscall}")),
            "the guest reached the device thread under the filter"
        );
        assert_eq!(status.signal(), Some(libc::SIGSYS), "{syscall} on the device thread must kill: {status}");
        assert!(!stdout.contains("probe returned"), "{syscall} returned instead of being refused");
    }
}

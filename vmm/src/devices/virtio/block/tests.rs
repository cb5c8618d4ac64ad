//! virtio-blk driven the way a driver does: chains in guest memory, then
//! the used ring, status bytes and data checked.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;

use virtio_bindings::virtio_blk::*;
use virtio_queue::Queue;

use super::{Block, BlockBackend, FileBackend};
use crate::devices::virtio::test_utils::{memory, read, write, Buf, DriverQueue};
use crate::devices::virtio::{GuestMemory, VirtioDevice, VIRTIO_F_VERSION_1};

const HDR: u64 = 0x10_0000;
const STATUS: u64 = 0x10_0100;
const DATA: u64 = 0x20_0000;

struct Harness {
    mem: GuestMemory,
    driver: DriverQueue,
    queues: Vec<Queue>,
    dev: Block,
}

fn disk_file(len: usize, read_only: bool) -> (tempfile::NamedTempFile, Arc<dyn BlockBackend>) {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    let content: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    file.write_all(&content).expect("fill disk");
    let backend = FileBackend::new(file.reopen().expect("reopen"), read_only).expect("backend");
    (file, Arc::new(backend))
}

impl Harness {
    fn new(disk: Arc<dyn BlockBackend>) -> Self {
        let mem = memory();
        let driver = DriverQueue::new(&mem, 0, 16);
        let queues = vec![driver.device_queue()];
        Self { mem, driver, queues, dev: Block::new(disk, "pvisor-disk-0123456789") }
    }

    /// Sends one request whose data buffers are `data`; returns (status, used len).
    fn request(&mut self, kind: u32, sector: u64, data: &[Buf]) -> (u8, u32) {
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        write(&self.mem, HDR, &header);
        write(&self.mem, STATUS, &[0xff]);
        let mut chain = vec![Buf::r(HDR, 16)];
        chain.extend_from_slice(data);
        chain.push(Buf::w(STATUS, 1));
        self.send(&chain)
    }

    fn send(&mut self, chain: &[Buf]) -> (u8, u32) {
        let head = self.driver.add_chain(&self.mem, chain);
        let used = self.dev.process_queue(0, &mut self.queues, &self.mem);
        assert!(used.contains(0), "request not completed");
        let entries = self.driver.take_used(&self.mem);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, u32::from(head));
        (read(&self.mem, STATUS, 1)[0], entries[0].1)
    }
}

#[test]
fn features_and_config() {
    let (_f, disk) = disk_file(8192 + 100, false);
    let h = Harness::new(disk);
    let features = h.dev.features();
    assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
    assert_eq!(features & (1 << VIRTIO_BLK_F_RO), 0);
    assert_ne!(features & (1 << VIRTIO_BLK_F_FLUSH), 0);
    let mut capacity = [0u8; 8];
    h.dev.read_config(0, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), 16, "capacity counts whole 512-byte sectors");
    let mut past = [0xffu8; 4];
    h.dev.read_config(1000, &mut past);
    assert_eq!(past, [0; 4]);
    assert_eq!(h.dev.device_type(), 2);
}

#[test]
fn reads_sectors_across_buffers() {
    let (_f, disk) = disk_file(64 * 1024, false);
    let mut h = Harness::new(disk);
    let (status, len) = h.request(VIRTIO_BLK_T_IN, 3, &[Buf::w(DATA, 512), Buf::w(DATA + 0x1000, 1024)]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(len, 1536 + 1);
    let expected: Vec<u8> = (3 * 512..6 * 512).map(|i| (i % 251) as u8).collect();
    let mut got = read(&h.mem, DATA, 512);
    got.extend(read(&h.mem, DATA + 0x1000, 1024));
    assert_eq!(got, expected);
}

#[test]
fn writes_persist_and_flush() {
    let (file, disk) = disk_file(16 * 1024, false);
    let mut h = Harness::new(disk);
    write(&h.mem, DATA, &[0xab; 1024]);
    let (status, len) = h.request(VIRTIO_BLK_T_OUT, 2, &[Buf::r(DATA, 1024)]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(len, 1, "only the status byte is written for OUT");
    let (status, _) = h.request(VIRTIO_BLK_T_FLUSH, 0, &[]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    let mut f = file.reopen().expect("reopen");
    let mut on_disk = vec![0u8; 1024];
    f.seek(SeekFrom::Start(1024)).expect("seek");
    f.read_exact(&mut on_disk).expect("read back");
    assert_eq!(on_disk, vec![0xab; 1024]);
    // And the guest reads back what it wrote.
    let (status, _) = h.request(VIRTIO_BLK_T_IN, 2, &[Buf::w(DATA + 0x10000, 1024)]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(read(&h.mem, DATA + 0x10000, 1024), vec![0xab; 1024]);
}

#[test]
fn out_of_range_is_ioerr() {
    let (_f, disk) = disk_file(4096, false);
    let mut h = Harness::new(disk);
    // Last sector is fine, one past it is not, nor a read straddling the end.
    assert_eq!(h.request(VIRTIO_BLK_T_IN, 7, &[Buf::w(DATA, 512)]).0, VIRTIO_BLK_S_OK as u8);
    assert_eq!(h.request(VIRTIO_BLK_T_IN, 8, &[Buf::w(DATA, 512)]).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.request(VIRTIO_BLK_T_IN, 7, &[Buf::w(DATA, 1024)]).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.request(VIRTIO_BLK_T_OUT, 8, &[Buf::r(DATA, 512)]).0, VIRTIO_BLK_S_IOERR as u8);
    // A sector number whose byte offset overflows u64.
    assert_eq!(h.request(VIRTIO_BLK_T_IN, u64::MAX / 2, &[Buf::w(DATA, 512)]).0, VIRTIO_BLK_S_IOERR as u8);
}

#[test]
fn read_only_refuses_writes() {
    let (file, disk) = disk_file(4096, true);
    let mut h = Harness::new(disk);
    assert_ne!(h.dev.features() & (1 << VIRTIO_BLK_F_RO), 0);
    write(&h.mem, DATA, &[0xcd; 512]);
    assert_eq!(h.request(VIRTIO_BLK_T_OUT, 0, &[Buf::r(DATA, 512)]).0, VIRTIO_BLK_S_IOERR as u8);
    let mut first = [0u8; 1];
    file.reopen().expect("reopen").read_exact(&mut first).expect("read");
    assert_eq!(first[0], 0, "disk unchanged");
    assert_eq!(h.request(VIRTIO_BLK_T_IN, 0, &[Buf::w(DATA, 512)]).0, VIRTIO_BLK_S_OK as u8);
}

#[test]
fn get_id_and_unsupported() {
    let (_f, disk) = disk_file(4096, false);
    let mut h = Harness::new(disk);
    let (status, len) = h.request(VIRTIO_BLK_T_GET_ID, 0, &[Buf::w(DATA, 20)]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(len, 21);
    assert_eq!(read(&h.mem, DATA, 20), b"pvisor-disk-01234567".to_vec());
    assert_eq!(h.request(0x1234, 0, &[]).0, VIRTIO_BLK_S_UNSUPP as u8);
}

#[test]
fn malformed_chains_never_panic() {
    let (_f, disk) = disk_file(4096, false);
    let mut h = Harness::new(disk);
    // Header too short: IOERR.
    write(&h.mem, STATUS, &[0xff]);
    let (status, len) = h.send(&[Buf::r(HDR, 8), Buf::w(STATUS, 1)]);
    assert_eq!((status, len), (VIRTIO_BLK_S_IOERR as u8, 1));
    // No writable byte at all: completed with length 0, nothing written.
    write(&h.mem, STATUS, &[0xee]);
    let (status, len) = h.send(&[Buf::r(HDR, 16)]);
    assert_eq!((status, len), (0xee, 0));
    // A data buffer outside guest memory: completed with length 0.
    let (_, len) = h.request(VIRTIO_BLK_T_IN, 0, &[Buf::w(0xffff_0000_0000, 512)]);
    assert_eq!(len, 0);
    // A self-referencing descriptor loop.
    h.driver.write_desc(&h.mem, 10, HDR, 16, crate::devices::virtio::test_utils::DESC_F_NEXT, 10);
    h.driver.publish(&h.mem, 10);
    let used = h.dev.process_queue(0, &mut h.queues, &h.mem);
    assert!(used.contains(0));
    assert_eq!(h.driver.take_used(&h.mem).len(), 1);
    // The device still works afterwards.
    assert_eq!(h.request(VIRTIO_BLK_T_IN, 0, &[Buf::w(DATA, 512)]).0, VIRTIO_BLK_S_OK as u8);
}

/// A backend over memory whose reads come back short, as a view over
/// chunks may (the erofs view's `read_at` returns at most one chunk).
struct Chunky(Vec<u8>);

impl BlockBackend for Chunky {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let start = offset as usize;
        let n = buf.len().min(100).min(self.0.len() - start);
        buf[..n].copy_from_slice(&self.0[start..start + n]);
        Ok(n)
    }
    fn write_at(&self, _offset: u64, _buf: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::PermissionDenied.into())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn read_only(&self) -> bool {
        true
    }
}

#[test]
fn short_backend_reads_are_completed() {
    let image: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let mut h = Harness::new(Arc::new(Chunky(image.clone())));
    let (status, _) = h.request(VIRTIO_BLK_T_IN, 1, &[Buf::w(DATA, 2048)]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(read(&h.mem, DATA, 2048), image[512..2560].to_vec());
}

fn segment(sector: u64, sectors: u32, flags: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&sector.to_le_bytes());
    s[8..12].copy_from_slice(&sectors.to_le_bytes());
    s[12..16].copy_from_slice(&flags.to_le_bytes());
    s
}

#[test]
fn discard_and_write_zeroes_punch_holes() {
    let (file, disk) = disk_file(64 * 1024, false);
    let mut h = Harness::new(disk);
    let features = h.dev.features();
    assert_ne!(features & (1 << VIRTIO_BLK_F_DISCARD), 0);
    assert_ne!(features & (1 << VIRTIO_BLK_F_WRITE_ZEROES), 0);
    // Two segments: sectors 8..16 and 32..40 (4 KiB each, whole blocks).
    let mut segs = segment(8, 8, 0).to_vec();
    segs.extend_from_slice(&segment(32, 8, 0));
    write(&h.mem, DATA, &segs);
    assert_eq!(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Buf::r(DATA, 32)]).0, VIRTIO_BLK_S_OK as u8);
    write(&h.mem, DATA, &segment(48, 8, 1));
    assert_eq!(h.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[Buf::r(DATA, 16)]).0, VIRTIO_BLK_S_OK as u8);
    let mut content = Vec::new();
    file.reopen().expect("reopen").read_to_end(&mut content).expect("read");
    assert_eq!(content.len(), 64 * 1024, "size kept");
    for (i, byte) in content.iter().enumerate() {
        let zeroed = (4096..8192).contains(&i) || (16384..20480).contains(&i) || (24576..28672).contains(&i);
        let expected = if zeroed { 0 } else { (i % 251) as u8 };
        assert_eq!(*byte, expected, "byte {i}");
    }
    // A segment past the end, an unmap flag on DISCARD, a partial segment.
    write(&h.mem, DATA, &segment(127, 2, 0));
    assert_eq!(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Buf::r(DATA, 16)]).0, VIRTIO_BLK_S_IOERR as u8);
    write(&h.mem, DATA, &segment(0, 1, 1));
    assert_eq!(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Buf::r(DATA, 16)]).0, VIRTIO_BLK_S_UNSUPP as u8);
    assert_eq!(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Buf::r(DATA, 10)]).0, VIRTIO_BLK_S_IOERR as u8);
    // Read-only disks do not offer it.
    let (_f, ro) = disk_file(4096, true);
    let mut h = Harness::new(ro);
    assert_eq!(h.dev.features() & (1 << VIRTIO_BLK_F_DISCARD), 0);
    write(&h.mem, DATA, &segment(0, 1, 0));
    assert_eq!(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Buf::r(DATA, 16)]).0, VIRTIO_BLK_S_UNSUPP as u8);
}

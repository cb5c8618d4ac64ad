//! Test helpers: guest memory, and a split virtqueue driven from the
//! driver's side (descriptor table, avail ring, used ring in guest memory).

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::GuestMemory;

/// Descriptor flags.
pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;

/// 4 MiB of guest memory at address 0.
pub fn memory() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("guest memory")
}

/// One buffer of a chain: guest address, length, device-writable.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

impl Buf {
    pub fn r(addr: u64, len: u32) -> Self {
        Self { addr, len, write: false }
    }
    pub fn w(addr: u64, len: u32) -> Self {
        Self { addr, len, write: true }
    }
}

/// The driver's view of one split queue.
pub struct DriverQueue {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl DriverQueue {
    /// A queue of `size` entries whose rings start at `base` (needs
    /// `size * 16 + 6 + 2 * size + 6 + 8 * size` bytes, 4 KiB aligned parts).
    pub fn new(mem: &GuestMemory, base: u64, size: u16) -> Self {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 0xfff) & !0xfff;
        let q = Self { size, desc, avail, used, next_desc: 0, avail_idx: 0, used_seen: 0 };
        mem.write_obj(0u16, GuestAddress(avail)).expect("avail flags");
        mem.write_obj(0u16, GuestAddress(avail + 2)).expect("avail idx");
        mem.write_obj(0u16, GuestAddress(used + 2)).expect("used idx");
        q
    }

    /// A device-side `Queue` set up the way the driver programmed it.
    pub fn device_queue(&self) -> Queue {
        let mut q = Queue::new(self.size).expect("queue");
        q.set_size(self.size);
        q.set_desc_table_address(Some(self.desc as u32), Some((self.desc >> 32) as u32));
        q.set_avail_ring_address(Some(self.avail as u32), Some((self.avail >> 32) as u32));
        q.set_used_ring_address(Some(self.used as u32), Some((self.used >> 32) as u32));
        q.set_ready(true);
        q
    }

    /// Writes a descriptor at `index`.
    pub fn write_desc(&self, mem: &GuestMemory, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self.desc + 16 * u64::from(index);
        mem.write_obj(addr, GuestAddress(at)).expect("desc addr");
        mem.write_obj(len, GuestAddress(at + 8)).expect("desc len");
        mem.write_obj(flags, GuestAddress(at + 12)).expect("desc flags");
        mem.write_obj(next, GuestAddress(at + 14)).expect("desc next");
    }

    /// Publishes descriptor `head` in the avail ring.
    pub fn publish(&mut self, mem: &GuestMemory, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        mem.write_obj(head, GuestAddress(slot)).expect("avail ring");
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2)).expect("avail idx");
    }

    /// Adds a chain of `bufs` and makes it available; returns its head.
    pub fn add_chain(&mut self, mem: &GuestMemory, bufs: &[Buf]) -> u16 {
        assert!(!bufs.is_empty());
        let head = self.next_desc;
        for (i, buf) in bufs.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let last = i + 1 == bufs.len();
            let mut flags = if buf.write { DESC_F_WRITE } else { 0 };
            if !last {
                flags |= DESC_F_NEXT;
            }
            self.write_desc(mem, index, buf.addr, buf.len, flags, (index + 1) % self.size);
        }
        self.next_desc = (head + bufs.len() as u16) % self.size;
        self.publish(mem, head);
        head
    }

    /// Used entries (id, len) added since the last call.
    pub fn take_used(&mut self, mem: &GuestMemory) -> Vec<(u32, u32)> {
        let idx: u16 = mem.read_obj(GuestAddress(self.used + 2)).expect("used idx");
        let mut out = Vec::new();
        while self.used_seen != idx {
            let at = self.used + 4 + 8 * u64::from(self.used_seen % self.size);
            let id: u32 = mem.read_obj(GuestAddress(at)).expect("used id");
            let len: u32 = mem.read_obj(GuestAddress(at + 4)).expect("used len");
            out.push((id, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

/// Reads `len` bytes of guest memory.
pub fn read(mem: &GuestMemory, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read_slice(&mut v, GuestAddress(addr)).expect("read guest memory");
    v
}

/// Writes guest memory.
pub fn write(mem: &GuestMemory, addr: u64, data: &[u8]) {
    mem.write_slice(data, GuestAddress(addr)).expect("write guest memory");
}

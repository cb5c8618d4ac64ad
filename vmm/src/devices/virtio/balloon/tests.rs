use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use virtio_queue::Queue;

use super::*;
use crate::devices::virtio::test_utils::{read, write, Buf, DriverQueue};
use crate::devices::virtio::{GuestMemory, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::memory::GuestRam;

const MIB: u64 = 1 << 20;
/// Rings live in the first MiB; the pages reported are above it.
const RINGS: u64 = 0x1000;
const DATA: u64 = 2 * MIB;

/// A balloon with its three queues set up by a driver at `RINGS`.
fn setup(mem: &GuestMemory) -> (Balloon, Vec<Queue>, Vec<DriverQueue>) {
    let mut b = Balloon::new();
    b.ack_features(b.features());
    let drivers: Vec<DriverQueue> = (0..3).map(|i| DriverQueue::new(mem, RINGS + i * 0x4000, QUEUE_SIZE)).collect();
    let queues = drivers.iter().map(DriverQueue::device_queue).collect();
    (b, queues, drivers)
}

/// Bytes the memfd behind `ram` holds.
fn memfd_bytes(ram: &GuestRam) -> u64 {
    let fd = ram.fd().expect("memfd");
    // SAFETY: fstat fills the zeroed struct for a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call; `st` is a valid out pointer.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as u64 * 512
}

#[test]
fn offers_reporting_and_three_queues() {
    let b = Balloon::new();
    assert_eq!(b.device_type(), 5);
    assert_eq!(b.features(), 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_BALLOON_F_REPORTING);
    assert_eq!(b.queue_max_sizes(), &[QUEUE_SIZE; 3]);
    let mut num_pages = [0xffu8; 4];
    b.read_config(0, &mut num_pages);
    assert_eq!(num_pages, [0; 4], "the device never asks for pages");
}

#[test]
fn only_actual_is_writable_in_config() {
    let mut b = Balloon::new();
    b.write_config(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let mut cfg = [0u8; 8];
    b.read_config(0, &mut cfg);
    assert_eq!(cfg, [0, 0, 0, 0, 5, 6, 7, 8]);
}

#[test]
fn reported_pages_of_the_memfd_go_back_to_the_host() {
    let ram = GuestRam::new(8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &vec![0xab; (2 * MIB) as usize]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    let head = drivers[REPORTING_QUEUE].add_chain(&mem, &[Buf::w(DATA, MIB as u32), Buf::w(DATA + MIB, MIB as u32)]);
    let before = memfd_bytes(&ram);
    let used = b.process_queue(REPORTING_QUEUE, &mut queues, &mem);
    assert!(used.contains(REPORTING_QUEUE));
    assert_eq!(drivers[REPORTING_QUEUE].take_used(&mem), vec![(u32::from(head), 0)]);
    assert_eq!(b.counters().reported_bytes.load(Ordering::Relaxed), 2 * MIB);
    assert_eq!(before - memfd_bytes(&ram), 2 * MIB, "the memfd shrank by the reported pages");
    assert!(read(&mem, DATA, (2 * MIB) as usize).iter().all(|&x| x == 0));
}

#[test]
fn reported_pages_of_anonymous_ram_read_zero() {
    let ram = GuestRam::anonymous(8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &[7u8; 8192]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    drivers[REPORTING_QUEUE].add_chain(&mem, &[Buf::w(DATA, 4096)]);
    b.process_queue(REPORTING_QUEUE, &mut queues, &mem);
    assert!(read(&mem, DATA, 4096).iter().all(|&x| x == 0));
    assert_eq!(read(&mem, DATA + 4096, 4096), vec![7u8; 4096], "the page after the block is untouched");
}

#[test]
fn a_private_restore_falls_back_to_the_snapshot_s_page() {
    let mut file = tempfile::tempfile().expect("file");
    std::io::Write::write_all(&mut file, &vec![0x5a; (8 * MIB) as usize]).expect("fill");
    let ram = GuestRam::from_snapshot(file, 8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &[1u8; 4096]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    drivers[REPORTING_QUEUE].add_chain(&mem, &[Buf::w(DATA, 4096)]);
    b.process_queue(REPORTING_QUEUE, &mut queues, &mem);
    assert_eq!(read(&mem, DATA, 4096), vec![0x5a; 4096], "the clone's own copy was dropped");
}

#[test]
fn blocks_outside_guest_memory_are_counted_and_the_chain_still_returned() {
    let ram = GuestRam::new(8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &[3u8; 4096]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    let head = drivers[REPORTING_QUEUE]
        .add_chain(&mem, &[Buf::w(8 * MIB - 4096, 8192), Buf::w(u64::MAX - 4095, 4096), Buf::w(DATA, 4096)]);
    b.process_queue(REPORTING_QUEUE, &mut queues, &mem);
    assert_eq!(drivers[REPORTING_QUEUE].take_used(&mem), vec![(u32::from(head), 0)]);
    let c = b.counters();
    assert_eq!(c.bad_blocks.load(Ordering::Relaxed), 2);
    assert_eq!(c.reported_bytes.load(Ordering::Relaxed), 4096, "the good block was still given back");
    assert_eq!(read(&mem, 8 * MIB - 4096, 4096), vec![0u8; 4096]);
}

#[test]
fn unaligned_blocks_give_back_only_whole_pages() {
    let ram = GuestRam::new(8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &[9u8; 3 * 4096]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    drivers[REPORTING_QUEUE].add_chain(&mem, &[Buf::w(DATA + 100, 2 * 4096)]);
    b.process_queue(REPORTING_QUEUE, &mut queues, &mem);
    assert_eq!(b.counters().reported_bytes.load(Ordering::Relaxed), 4096);
    assert_eq!(read(&mem, DATA, 4096), vec![9u8; 4096]);
    assert_eq!(read(&mem, DATA + 4096, 4096), vec![0u8; 4096]);
    assert_eq!(read(&mem, DATA + 2 * 4096, 4096), vec![9u8; 4096]);
}

#[test]
fn inflate_chains_are_returned_without_touching_memory() {
    let ram = GuestRam::new(8 * MIB).expect("ram");
    let mem = ram.memory().clone();
    write(&mem, DATA, &[4u8; 4096]);
    let (mut b, mut queues, mut drivers) = setup(&mem);
    // An inflate chain holds PFNs; this one names the page at DATA.
    write(&mem, MIB, &((DATA >> 12) as u32).to_le_bytes());
    let head = drivers[INFLATE_QUEUE].add_chain(&mem, &[Buf::r(MIB, 4)]);
    let used = b.process_queue(INFLATE_QUEUE, &mut queues, &mem);
    assert!(used.contains(INFLATE_QUEUE));
    assert_eq!(drivers[INFLATE_QUEUE].take_used(&mem), vec![(u32::from(head), 0)]);
    assert_eq!(read(&mem, DATA, 4096), vec![4u8; 4096]);
    assert_eq!(b.counters().reported_bytes.load(Ordering::Relaxed), 0);
}

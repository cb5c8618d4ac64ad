//! The virtio-mmio register file and state machine, driven as the Linux
//! driver does, with a recording device behind it.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryAtomic;

use super::regs::*;
use super::MmioTransport;
use crate::bus::BusDevice;
use crate::devices::virtio::event_loop::EventLoop;
use crate::devices::virtio::test_utils::{memory, Buf, DriverQueue};
use crate::devices::virtio::{GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1};

#[derive(Default)]
struct Log {
    acked: Option<u64>,
    processed: Vec<usize>,
    resets: usize,
}

/// Two queues; completes every chain of a notified queue with length 7.
struct Recorder(Arc<Mutex<Log>>);

impl VirtioDevice for Recorder {
    fn device_type(&self) -> u32 {
        42
    }
    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << 3 | 1 << 40
    }
    fn ack_features(&mut self, features: u64) {
        self.0.lock().expect("log").acked = Some(features);
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16, 8]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::devices::virtio::read_config_bytes(&[1, 2, 3, 4, 5, 6, 7, 8], offset, data);
    }
    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        self.0.lock().expect("log").processed.push(index);
        let mut used = UsedQueues::NONE;
        while let Some(chain) = queues[index].pop_descriptor_chain(mem) {
            queues[index].add_used(mem, chain.head_index(), 7).expect("add_used");
            used.set(index);
        }
        used
    }
    fn reset(&mut self) {
        self.0.lock().expect("log").resets += 1;
    }
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Ok(())
    }
}

pub(crate) fn rd(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

pub(crate) fn wr(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

fn transport() -> (MmioTransport, Arc<Mutex<Log>>, GuestMemory) {
    let log = Arc::new(Mutex::new(Log::default()));
    let mem = memory();
    let t =
        MmioTransport::new(Box::new(Recorder(log.clone())), GuestMemoryAtomic::new(mem.clone())).expect("transport");
    (t, log, mem)
}

/// Negotiates `features` and returns the resulting status.
pub(crate) fn negotiate(t: &mut MmioTransport, features: u64) -> u32 {
    wr(t, STATUS, STATUS_ACKNOWLEDGE);
    wr(t, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    wr(t, DRIVER_FEATURES_SEL, 0);
    wr(t, DRIVER_FEATURES, features as u32);
    wr(t, DRIVER_FEATURES_SEL, 1);
    wr(t, DRIVER_FEATURES, (features >> 32) as u32);
    wr(t, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
    rd(t, STATUS)
}

pub(crate) fn setup_queue(t: &mut MmioTransport, index: u32, q: &DriverQueue) {
    wr(t, QUEUE_SEL, index);
    wr(t, QUEUE_NUM, u32::from(q.size));
    wr(t, QUEUE_DESC_LOW, q.desc as u32);
    wr(t, QUEUE_DESC_HIGH, (q.desc >> 32) as u32);
    wr(t, QUEUE_DRIVER_LOW, q.avail as u32);
    wr(t, QUEUE_DRIVER_HIGH, 0);
    wr(t, QUEUE_DEVICE_LOW, q.used as u32);
    wr(t, QUEUE_DEVICE_HIGH, 0);
    wr(t, QUEUE_READY, 1);
}

pub(crate) const OK: u32 = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;

#[test]
fn identification_registers() {
    let (mut t, _, _) = transport();
    assert_eq!(rd(&mut t, MAGIC), 0x7472_6976);
    assert_eq!(rd(&mut t, VERSION_REG), 2);
    assert_eq!(rd(&mut t, DEVICE_ID), 42);
    assert_eq!(rd(&mut t, VENDOR_ID_REG), VENDOR_ID);
    wr(&mut t, DEVICE_FEATURES_SEL, 0);
    assert_eq!(rd(&mut t, DEVICE_FEATURES), 1 << 3);
    wr(&mut t, DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(&mut t, DEVICE_FEATURES), 1 | 1 << 8);
    wr(&mut t, DEVICE_FEATURES_SEL, 2);
    assert_eq!(rd(&mut t, DEVICE_FEATURES), 0);
    wr(&mut t, QUEUE_SEL, 1);
    assert_eq!(rd(&mut t, QUEUE_NUM_MAX), 8);
    wr(&mut t, QUEUE_SEL, 2);
    assert_eq!(rd(&mut t, QUEUE_NUM_MAX), 0, "a queue that does not exist");
    let mut config = [0u8; 4];
    t.read(CONFIG + 2, &mut config);
    assert_eq!(config, [3, 4, 5, 6]);
    // Misaligned and odd-sized register reads are zero, not a panic.
    let mut odd = [0xffu8; 2];
    t.read(MAGIC, &mut odd);
    assert_eq!(odd, [0, 0]);
}

#[test]
fn feature_negotiation() {
    let (mut t, log, _) = transport();
    // Without VERSION_1 FEATURES_OK does not stick.
    assert_eq!(negotiate(&mut t, 1 << 3), STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    assert_eq!(log.lock().expect("log").acked, None);
    wr(&mut t, STATUS, 0);
    // Nor with a feature the device did not offer.
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1 | 1 << 5), STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    wr(&mut t, STATUS, 0);
    let wanted = 1 << VIRTIO_F_VERSION_1 | 1 << 40;
    assert_eq!(negotiate(&mut t, wanted), OK);
    assert_eq!(log.lock().expect("log").acked, Some(wanted));
    // Features are frozen after FEATURES_OK.
    wr(&mut t, DRIVER_FEATURES_SEL, 0);
    wr(&mut t, DRIVER_FEATURES, 1 << 3);
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    assert_eq!(rd(&mut t, STATUS), OK | STATUS_DRIVER_OK);
    assert_eq!(log.lock().expect("log").acked, Some(wanted));
}

#[test]
fn driver_ok_needs_features_ok_and_activates() {
    let (mut t, log, mem) = transport();
    wr(&mut t, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    wr(&mut t, STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK);
    assert_eq!(rd(&mut t, STATUS) & STATUS_DRIVER_OK, 0);
    assert!(!t.cell().lock().expect("cell").is_active());
    wr(&mut t, STATUS, 0);

    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1), OK);
    let mut q0 = DriverQueue::new(&mem, 0x1_0000, 16);
    setup_queue(&mut t, 0, &q0);
    wr(&mut t, QUEUE_SEL, 0);
    assert_eq!(rd(&mut t, QUEUE_READY), 1);
    // Before DRIVER_OK a notification is not processed.
    q0.add_chain(&mem, &[Buf::w(0x8_0000, 8)]);
    assert!(!t.cell().lock().expect("cell").process_queue(0).any());
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    assert_eq!(rd(&mut t, STATUS), OK | STATUS_DRIVER_OK);
    assert!(t.cell().lock().expect("cell").is_active());
    assert!(t.cell().lock().expect("cell").process_queue(0).contains(0));
    assert_eq!(q0.take_used(&mem), vec![(0, 7)]);
    assert_eq!(log.lock().expect("log").processed, vec![0]);
    // Queue registers are frozen once the device runs.
    wr(&mut t, QUEUE_SEL, 0);
    wr(&mut t, QUEUE_READY, 0);
    assert_eq!(rd(&mut t, QUEUE_READY), 1);
}

#[test]
fn queue_outside_memory_needs_reset() {
    let (mut t, _, _) = transport();
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1), OK);
    wr(&mut t, QUEUE_SEL, 0);
    wr(&mut t, QUEUE_NUM, 16);
    wr(&mut t, QUEUE_DESC_LOW, 0);
    wr(&mut t, QUEUE_DESC_HIGH, 0x100);
    wr(&mut t, QUEUE_READY, 1);
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    assert_eq!(rd(&mut t, STATUS), OK | STATUS_DEVICE_NEEDS_RESET);
    assert!(!t.cell().lock().expect("cell").is_active());
}

#[test]
fn reset_clears_everything() {
    let (mut t, log, mem) = transport();
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1), OK);
    setup_queue(&mut t, 0, &DriverQueue::new(&mem, 0x1_0000, 16));
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    t.interrupt().trigger(INT_USED_BUFFER);
    wr(&mut t, STATUS, 0);
    assert_eq!(rd(&mut t, STATUS), 0);
    assert_eq!(rd(&mut t, INTERRUPT_STATUS), 0);
    wr(&mut t, QUEUE_SEL, 0);
    assert_eq!(rd(&mut t, QUEUE_READY), 0);
    assert!(!t.cell().lock().expect("cell").is_active());
    assert_eq!(log.lock().expect("log").resets, 1);
    // And the device can be brought up again.
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1), OK);
}

#[test]
fn notify_interrupt_and_ack_through_the_event_loop() {
    let (mut t, _, mem) = transport();
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1), OK);
    let mut q1 = DriverQueue::new(&mem, 0x2_0000, 8);
    setup_queue(&mut t, 1, &q1);
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    let mut event_loop = EventLoop::new().expect("event loop");
    event_loop.add(&t).expect("add device");

    q1.add_chain(&mem, &[Buf::w(0x8_0000, 8)]);
    // A plain MMIO write to QueueNotify (no ioeventfd) signals the queue's fd.
    wr(&mut t, QUEUE_NOTIFY, 1);
    assert!(event_loop.run_once(10_000).expect("run"));
    assert_eq!(q1.take_used(&mem), vec![(0, 7)]);
    assert_eq!(rd(&mut t, INTERRUPT_STATUS), INT_USED_BUFFER);
    assert_eq!(t.interrupt().irq_fd().read().expect("irqfd signalled"), 1);
    wr(&mut t, INTERRUPT_ACK, INT_USED_BUFFER);
    assert_eq!(rd(&mut t, INTERRUPT_STATUS), 0);
    // A notify for a queue that does not exist is ignored.
    wr(&mut t, QUEUE_NOTIFY, 9);

    let exit = event_loop.exit_evt().expect("exit evt");
    exit.write(1).expect("exit");
    assert!(!event_loop.run_once(10_000).expect("run"));
}

#[test]
fn a_saved_transport_restores_with_its_registers_queues_and_pending_interrupt() {
    let (mut t, _, mem) = transport();
    assert_eq!(negotiate(&mut t, 1 << VIRTIO_F_VERSION_1 | 1 << 40), OK);
    let mut q0 = DriverQueue::new(&mem, 0x1_0000, 16);
    setup_queue(&mut t, 0, &q0);
    wr(&mut t, STATUS, OK | STATUS_DRIVER_OK);
    q0.add_chain(&mem, &[Buf::w(0x8_0000, 8)]);
    assert!(t.cell().lock().expect("cell").process_queue(0).contains(0));
    assert_eq!(q0.take_used(&mem), vec![(0, 7)]);
    t.interrupt().trigger(INT_USED_BUFFER);
    wr(&mut t, QUEUE_SEL, 1);
    let state = t.save_state().expect("saving the transport");
    assert!(state.active);
    assert_eq!(state.queues[0].0.next_used, 1);

    // Through serde, as a snapshot file carries it.
    let state: super::snapshot::TransportState =
        serde_json::from_slice(&serde_json::to_vec(&state).expect("encode")).expect("decode");
    let log = Arc::new(Mutex::new(Log::default()));
    let mut r = MmioTransport::restore(Box::new(Recorder(log.clone())), GuestMemoryAtomic::new(mem.clone()), &state)
        .expect("restoring the transport");
    assert_eq!(log.lock().expect("log").acked, Some(1 << VIRTIO_F_VERSION_1 | 1 << 40), "features re-acked");
    assert_eq!(rd(&mut r, STATUS), OK | STATUS_DRIVER_OK);
    assert_eq!(rd(&mut r, INTERRUPT_STATUS), INT_USED_BUFFER);
    assert_eq!(r.interrupt().irq_fd().read().expect("the pending interrupt is signalled again"), 1);
    assert_eq!(rd(&mut r, QUEUE_NUM_MAX), 8, "QueueSel is still 1");
    // The queue continues where it was: the next chain lands in used slot 1.
    let mut event_loop = EventLoop::new().expect("event loop");
    event_loop.add(&r).expect("add device");
    q0.add_chain(&mem, &[Buf::w(0x8_0000, 8)]);
    r.kick_queues();
    assert!(event_loop.run_once(10_000).expect("run"));
    assert_eq!(q0.take_used(&mem), vec![(1, 7)], "the second chain (descriptor 1) was used");
    assert_eq!(r.cell().lock().expect("cell").queues[0].next_used(), 2);
    assert_eq!(log.lock().expect("log").processed, vec![0, 1], "the kick reached both queues");
}

#[test]
fn a_transport_state_is_refused_by_another_device() {
    use super::snapshot::TransportState;
    let (t, _, mem) = transport();
    let state = t.save_state().expect("saving the transport");
    let other = |state: &TransportState| {
        MmioTransport::restore(Box::new(Recorder(Arc::default())), GuestMemoryAtomic::new(mem.clone()), state)
    };
    assert!(other(&state).is_ok());
    for bad in [
        TransportState { device_type: 7, ..state.clone() },
        TransportState { offered: 1, ..state.clone() },
        TransportState { queues: state.queues[..1].to_vec(), ..state.clone() },
    ] {
        assert!(matches!(other(&bad), Err(super::Error::Mismatch(_))), "{bad:?}");
    }
}

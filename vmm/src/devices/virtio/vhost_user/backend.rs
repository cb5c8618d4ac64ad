//! `VhostUserBackend` over a [`VirtioDevice`]: the device model is the one
//! the virtio-mmio transport serves, the queues are the front-end's vrings.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Mutex, PoisonError};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::Queue;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};

use crate::devices::virtio::{GuestMemory, UsedQueues, VirtioDevice};

/// vring interrupts are one per queue; the device may use any of them.
const MAX_QUEUES: usize = 64;
/// QEMU's virtio-mmio reports its VIRTQUEUE_MAX_SIZE (1024) as QueueNumMax
/// whatever the device's `queue-size`, and Linux takes it, so a back-end
/// must accept rings that large. The models do not depend on the size.
const FRONTEND_MAX_QUEUE_SIZE: u16 = 1024;
/// VHOST_F_LOG_ALL (bit 26): the back-end logs its writes to guest memory
/// while the front-end migrates (in a log the front-end shares with
/// SET_LOG_BASE, protocol feature LOG_SHMFD). QEMU refuses any migration of a
/// machine with a vhost-user device lacking either ("Migration disabled:
/// vhost lacks VHOST_F_LOG_ALL", "... lacks VHOST_USER_PROTOCOL_F_LOG_SHMFD"),
/// snapshots of a stopped machine included. These back-ends offer both for
/// those: the worker migrates only a stopped machine (`stop`, then
/// `migrate`), whose vhost devices QEMU has stopped (GET_VRING_BASE), so they
/// write nothing while the state is saved and no log is needed (QEMU enables
/// logging only on started devices). A live migration would: its SET_LOG_BASE
/// fails (the memory has no bitmap, `Bitmap = ()`), so QEMU's migration fails
/// instead of copying memory that misses this back-end's writes, and
/// `acked_features` reports the attempt as an error.
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

struct Inner<D> {
    device: D,
    mem: GuestMemoryAtomic<GuestMemory>,
}

/// A device model served over vhost-user.
pub struct VhostUserDevice<D> {
    inner: Mutex<Inner<D>>,
    queue_sizes: Vec<u16>,
    features: u64,
    event_fd: Option<RawFd>,
    exit: (EventConsumer, EventNotifier),
}

impl<D: VirtioDevice> VhostUserDevice<D> {
    /// Wraps `device`.
    pub fn new(device: D) -> io::Result<Self> {
        let queue_sizes = device.queue_max_sizes().to_vec();
        if queue_sizes.len() > MAX_QUEUES {
            return Err(io::Error::other("too many queues"));
        }
        let features = device.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() | VHOST_F_LOG_ALL;
        let event_fd = device.event_fd();
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?;
        Ok(Self {
            inner: Mutex::new(Inner { device, mem: GuestMemoryAtomic::new(GuestMemory::default()) }),
            queue_sizes,
            features,
            event_fd,
            exit,
        })
    }

    /// The device's own event source, registered with the daemon's epoll
    /// under [`Self::device_event_token`].
    pub fn event_fd(&self) -> Option<RawFd> {
        self.event_fd
    }

    /// The token of the device's event source (past the queues and the
    /// library's own exit token).
    pub fn device_event_token(&self) -> u16 {
        self.queue_sizes.len() as u16 + 1
    }

    /// Asks the daemon's worker thread to stop.
    pub fn notify_exit(&self) {
        let _ = self.exit.1.notify();
    }

    /// Runs `f` on the device model (tests, inspection).
    pub fn with_device<T>(&self, f: impl FnOnce(&mut D) -> T) -> T {
        f(&mut self.lock().device)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<D>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the device on the vrings' queues (moved out and back under the
    /// vrings' write locks), then signals the used ones.
    fn run(&self, vrings: &[VringRwLock], f: impl FnOnce(&mut D, &mut [Queue], &GuestMemory) -> UsedQueues) {
        let used = {
            let mut inner = self.lock();
            let mut guards: Vec<_> = vrings.iter().map(|v| v.get_mut()).collect();
            let mut queues: Vec<Queue> = guards.iter_mut().map(|g| std::mem::take(g.get_queue_mut())).collect();
            let mem = inner.mem.memory();
            let used = f(&mut inner.device, &mut queues, &mem);
            for (guard, queue) in guards.iter_mut().zip(queues) {
                *guard.get_queue_mut() = queue;
            }
            used
        };
        for index in used.iter() {
            if let Some(vring) = vrings.get(index) {
                if vring.needs_notification().unwrap_or(true) {
                    if let Err(e) = vring.signal_used_queue() {
                        tracing::warn!("vhost-user: signalling queue {index}: {e}");
                    }
                }
            }
        }
    }
}

impl<D: VirtioDevice> VhostUserBackend for VhostUserDevice<D> {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.queue_sizes.len()
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.queue_sizes.iter().copied().max().unwrap_or(0).max(FRONTEND_MAX_QUEUE_SIZE))
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn acked_features(&self, features: u64) {
        if features & VHOST_F_LOG_ALL != 0 {
            // Dirty logging asked of running rings: a live migration, which these back-ends
            // do not support (they do not log). The guest's memory on the destination could
            // miss this device's writes; say so where the operator looks.
            tracing::error!(
                "vhost-user: the front-end enabled dirty logging (a live migration): not supported, \
                 only a stopped machine may be migrated"
            );
        }
        let device_features = features & !(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() | VHOST_F_LOG_ALL);
        self.lock().device.ack_features(device_features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // LOG_SHMFD: see VHOST_F_LOG_ALL.
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::LOG_SHMFD
    }

    fn reset_device(&self) {
        self.lock().device.reset();
    }

    fn set_event_idx(&self, _enabled: bool) {
        // VIRTIO_RING_F_EVENT_IDX is not offered.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut data = vec![0u8; size as usize];
        self.lock().device.read_config(u64::from(offset), &mut data);
        data
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.lock().device.write_config(u64::from(offset), buf);
        Ok(())
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemory>) -> io::Result<()> {
        self.lock().mem = mem;
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        Some((self.exit.0.try_clone().ok()?, self.exit.1.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread: usize,
    ) -> io::Result<()> {
        let index = usize::from(device_event);
        if index < self.queue_sizes.len() {
            self.run(vrings, |device, queues, mem| device.process_queue(index, queues, mem));
        } else if device_event == self.device_event_token() {
            self.run(vrings, |device, queues, mem| device.handle_event(queues, mem));
        }
        Ok(())
    }
}

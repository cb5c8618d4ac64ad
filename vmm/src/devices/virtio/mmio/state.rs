//! The device model and its queues, shared by the transport (register
//! accesses from vCPU threads) and the device thread (queue processing).

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

use super::Error;
use crate::devices::virtio::{GuestMemory, UsedQueues, VirtioDevice};

/// One device behind a transport.
pub struct DeviceCell {
    pub(crate) device: Box<dyn VirtioDevice>,
    pub(crate) queues: Vec<Queue>,
    /// Set at DRIVER_OK, cleared at reset: only an active device's queues
    /// are processed.
    pub(crate) active: bool,
    pub(crate) mem: GuestMemoryAtomic<GuestMemory>,
}

impl DeviceCell {
    pub(crate) fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryAtomic<GuestMemory>) -> Result<Self, Error> {
        let queues = device
            .queue_max_sizes()
            .iter()
            .enumerate()
            .map(|(index, max)| Queue::new(*max).map_err(|source| Error::Queue { index, source }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { device, queues, active: false, mem })
    }

    /// Whether the driver has set DRIVER_OK (and not reset since).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Queue `index` was notified: process it if the device is active.
    pub fn process_queue(&mut self, index: usize) -> UsedQueues {
        if !self.active || index >= self.queues.len() {
            return UsedQueues::NONE;
        }
        let mem = self.mem.memory();
        self.device.process_queue(index, &mut self.queues, &mem)
    }

    /// The device's own event source is readable. The device always gets
    /// to drain it (a level-triggered source left readable would spin the
    /// loop); before DRIVER_OK it sees no queues.
    pub fn handle_event(&mut self) -> UsedQueues {
        let mem = self.mem.memory();
        let queues: &mut [Queue] = if self.active { &mut self.queues } else { &mut [] };
        self.device.handle_event(queues, &mem)
    }

    /// Whether any of `used` needs an interrupt, given the driver's
    /// notification suppression.
    pub fn needs_interrupt(&mut self, used: UsedQueues) -> bool {
        let mem = self.mem.memory();
        let mut needed = false;
        for index in used.iter() {
            if let Some(queue) = self.queues.get_mut(index) {
                // If the ring cannot be read, interrupt rather than stall.
                needed |= queue.needs_notification(&*mem).unwrap_or(true);
            }
        }
        needed
    }

    /// The device's event fd, if any.
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.device.event_fd()
    }
}

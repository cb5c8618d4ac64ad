//! The virtio-mmio v2 register file and its device-status state machine.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::eventfd::EventFd;

use super::regs::*;
use super::{DeviceCell, Error, Interrupt};
use crate::bus::BusDevice;
use crate::devices::virtio::{GuestMemory, VirtioDevice, VIRTIO_F_VERSION_1};

/// Queue indices must fit the 32-bit QueueNotify value and our bitmasks.
const MAX_QUEUES: usize = 64;

/// A virtio device reachable through a virtio-mmio register window.
pub struct MmioTransport {
    pub(super) cell: Arc<Mutex<DeviceCell>>,
    pub(super) interrupt: Arc<Interrupt>,
    pub(super) queue_evts: Vec<EventFd>,
    pub(super) device_type: u32,
    pub(super) offered: u64,
    pub(super) device_features_sel: u32,
    pub(super) driver_features_sel: u32,
    pub(super) acked: u64,
    pub(super) queue_sel: u32,
    pub(super) status: u32,
}

impl MmioTransport {
    /// Puts `device` behind a fresh transport over guest memory `mem`.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryAtomic<GuestMemory>) -> Result<Self, Error> {
        let queue_count = device.queue_max_sizes().len();
        if queue_count > MAX_QUEUES {
            return Err(Error::TooManyQueues(queue_count));
        }
        let device_type = device.device_type();
        let offered = device.features();
        let queue_evts = (0..queue_count)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        let interrupt = Arc::new(Interrupt::new().map_err(Error::EventFd)?);
        let cell = Arc::new(Mutex::new(DeviceCell::new(device, mem)?));
        Ok(Self {
            cell,
            interrupt,
            queue_evts,
            device_type,
            offered,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked: 0,
            queue_sel: 0,
            status: 0,
        })
    }

    /// One eventfd per queue, in queue order: register each as a KVM
    /// ioeventfd on `base + QUEUE_NOTIFY` with datamatch = its index.
    pub fn queue_evts(&self) -> &[EventFd] {
        &self.queue_evts
    }

    /// The interrupt line: register [`Interrupt::irq_fd`] as the irqfd.
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// The device and its queues, for the device thread.
    pub fn cell(&self) -> &Arc<Mutex<DeviceCell>> {
        &self.cell
    }

    /// The device status register as the driver last set it.
    pub fn status(&self) -> u32 {
        self.status
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, DeviceCell> {
        // A panic while holding the lock leaves plain data behind; the
        // device keeps answering rather than poisoning the vCPU thread.
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_selected_queue<T>(&self, f: impl FnOnce(&mut Queue) -> T) -> Option<T> {
        let mut cell = self.lock();
        let index = usize::try_from(self.queue_sel).ok()?;
        cell.queues.get_mut(index).map(f)
    }

    fn read_reg(&self, offset: u64) -> u32 {
        match offset {
            MAGIC => MAGIC_VALUE,
            VERSION_REG => VERSION,
            DEVICE_ID => self.device_type,
            VENDOR_ID_REG => VENDOR_ID,
            DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered as u32,
                1 => (self.offered >> 32) as u32,
                _ => 0,
            },
            QUEUE_NUM_MAX => self.with_selected_queue(|q| q.max_size()).map_or(0, u32::from),
            QUEUE_READY => self.with_selected_queue(|q| q.ready()).map_or(0, u32::from),
            INTERRUPT_STATUS => self.interrupt.status(),
            STATUS => self.status,
            CONFIG_GENERATION => 0,
            _ => 0,
        }
    }

    /// Whether the driver may still change queue registers.
    fn queues_configurable(&self) -> bool {
        self.status & STATUS_FEATURES_OK != 0 && self.status & STATUS_DRIVER_OK == 0
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_sel = value,
            DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            DRIVER_FEATURES if self.status & STATUS_DRIVER != 0 && self.status & STATUS_FEATURES_OK == 0 => {
                match self.driver_features_sel {
                    0 => self.acked = (self.acked & !0xffff_ffff) | u64::from(value),
                    1 => self.acked = (self.acked & 0xffff_ffff) | (u64::from(value) << 32),
                    _ => {}
                }
            }
            QUEUE_SEL => self.queue_sel = value,
            QUEUE_NOTIFY => {
                if let Some(evt) = usize::try_from(value).ok().and_then(|i| self.queue_evts.get(i)) {
                    let _ = evt.write(1);
                }
            }
            INTERRUPT_ACK => self.interrupt.ack(value),
            STATUS => self.write_status(value),
            QUEUE_NUM | QUEUE_READY | QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH
            | QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH
                if self.queues_configurable() =>
            {
                self.with_selected_queue(|q| match offset {
                    // The guest's size is validated by virtio-queue (power of
                    // two, at most the maximum); an invalid one is ignored.
                    QUEUE_NUM => q.set_size(value as u16),
                    QUEUE_READY => q.set_ready(value == 1),
                    QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
                    QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
                    QUEUE_DRIVER_LOW => q.set_avail_ring_address(Some(value), None),
                    QUEUE_DRIVER_HIGH => q.set_avail_ring_address(None, Some(value)),
                    QUEUE_DEVICE_LOW => q.set_used_ring_address(Some(value), None),
                    _ => q.set_used_ring_address(None, Some(value)),
                });
            }
            _ => {}
        }
    }

    /// The device-status state machine: 0 resets; otherwise bits only
    /// accumulate, FEATURES_OK sticks only for an acceptable feature set and
    /// DRIVER_OK (after FEATURES_OK, with valid ready queues) activates.
    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        if value & self.status != self.status {
            // Clearing bits other than by reset is not allowed.
            return;
        }
        let new = value & !self.status;
        let mut accepted = self.status;
        if new & STATUS_FAILED != 0 {
            self.status |= STATUS_FAILED;
            return;
        }
        accepted |= new & (STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        if new & STATUS_FEATURES_OK != 0 && accepted & STATUS_DRIVER != 0 && self.features_acceptable() {
            accepted |= STATUS_FEATURES_OK;
            self.lock().device.ack_features(self.acked);
        }
        if new & STATUS_DRIVER_OK != 0 && accepted & STATUS_FEATURES_OK != 0 {
            if self.activate() {
                accepted |= STATUS_DRIVER_OK;
            } else {
                accepted |= STATUS_DEVICE_NEEDS_RESET;
            }
        }
        self.status = accepted;
    }

    fn features_acceptable(&self) -> bool {
        self.acked & !self.offered == 0 && self.acked & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&self) -> bool {
        let mut cell = self.lock();
        let mem = cell.mem.memory();
        let valid = cell.queues.iter().all(|q| !q.ready() || q.is_valid(&*mem));
        drop(mem);
        if valid {
            cell.active = true;
        }
        valid
    }

    fn reset(&mut self) {
        {
            let mut cell = self.lock();
            cell.active = false;
            cell.device.reset();
            cell.queues.iter_mut().for_each(QueueT::reset);
        }
        self.interrupt.clear();
        self.status = 0;
        self.acked = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG {
            self.lock().device.read_config(offset - CONFIG, data);
            return;
        }
        // Registers are 32 bits wide and accessed as such; anything else
        // reads as zero.
        if data.len() == 4 && offset & 3 == 0 {
            data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
        } else {
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG {
            self.lock().device.write_config(offset - CONFIG, data);
            return;
        }
        if let (Ok(bytes), true) = (<[u8; 4]>::try_from(data), offset & 3 == 0) {
            self.write_reg(offset, u32::from_le_bytes(bytes));
        }
    }
}

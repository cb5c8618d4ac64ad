//! A virtio-mmio transport's state for VM snapshots: its registers ([`TransportState`]) and
//! each queue's ([`QueueSnapshot`], virtio-queue's `QueueState` with serde), split as
//! Firecracker splits its `MmioTransportState` / `QueueState` / device state.
//!
//! What the device model behind it keeps beyond its acked features (which the transport
//! saves and hands back through `ack_features`) is the device's own business:
//! [`VirtioDevice::snapshot_support`] says whether a device has nothing else to carry (and can
//! therefore be snapshotted through the transport alone) or why not. A snapshot is taken with
//! the device thread kept out of the cell ([`MmioTransport::save_state`] holds the cell's lock),
//! so no queue is half-processed; a notification the device thread had not yet read is lost
//! with the old eventfds, which is why a restored transport's queues are kicked once
//! ([`MmioTransport::kick_queues`]): a device finding nothing new on a kick does nothing.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::eventfd::EventFd;

use super::{DeviceCell, Error, Interrupt, MmioTransport};
use crate::devices::virtio::{GuestMemory, VirtioDevice};

/// virtio-queue's `QueueState` (which has no serde of its own), declared once for serde's
/// `remote` derive: the field names are the snapshot format's.
#[derive(Serialize, Deserialize)]
#[serde(remote = "QueueState")]
struct QueueStateDef {
    /// The device's maximum size.
    max_size: u16,
    /// Next available-ring entry the device will read.
    next_avail: u16,
    /// Next used-ring entry the device will write.
    next_used: u16,
    /// `VIRTIO_F_RING_EVENT_IDX` negotiated.
    event_idx_enabled: bool,
    /// The size the driver chose.
    size: u16,
    /// The driver set QueueReady.
    ready: bool,
    /// Descriptor table address.
    desc_table: u64,
    /// Available (driver) ring address.
    avail_ring: u64,
    /// Used (device) ring address.
    used_ring: u64,
}

/// One queue: what the driver configured and where the device was in its rings (serialized
/// as the bare fields of [`QueueStateDef`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueueSnapshot(#[serde(with = "QueueStateDef")] pub QueueState);

impl From<QueueState> for QueueSnapshot {
    fn from(q: QueueState) -> Self {
        QueueSnapshot(q)
    }
}

impl From<QueueSnapshot> for QueueState {
    fn from(q: QueueSnapshot) -> Self {
        q.0
    }
}

/// The transport's registers and its queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device id, checked against the device handed to [`MmioTransport::restore`].
    pub device_type: u32,
    /// The features offered, checked likewise (a device offering others is another device).
    pub offered: u64,
    /// The features the driver acked.
    pub acked: u64,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// QueueSel.
    pub queue_sel: u32,
    /// The device status register.
    pub status: u32,
    /// InterruptStatus (bits the driver had not acked).
    pub interrupt_status: u32,
    /// DRIVER_OK was accepted: the device processes its queues.
    pub active: bool,
    /// Every queue, in index order.
    pub queues: Vec<QueueSnapshot>,
}

impl MmioTransport {
    /// The transport's state. Fails if the device has state the transport cannot carry.
    pub fn save_state(&self) -> Result<TransportState, Error> {
        self.state_of(&self.lock())
    }

    /// [`save_state`](Self::save_state) with the device cell already locked by the caller
    /// (`cell` must be this transport's, from [`cell`](Self::cell)), who keeps the device thread
    /// out for longer (a VM snapshot, until guest memory is written).
    pub fn state_of(&self, cell: &DeviceCell) -> Result<TransportState, Error> {
        cell.device.snapshot_support().map_err(Error::Unsupported)?;
        Ok(TransportState {
            device_type: self.device_type,
            offered: self.offered,
            acked: self.acked,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queue_sel: self.queue_sel,
            status: self.status,
            interrupt_status: self.interrupt.status(),
            active: cell.active,
            queues: cell.queues.iter().map(|q| QueueSnapshot::from(q.state())).collect(),
        })
    }

    /// A transport for `device` (the same kind, offering the same features) over `mem`, as
    /// `state` left it: registers, acked features (handed to the device again), queues, a
    /// pending interrupt. Register its fresh eventfds as a new transport's, then
    /// [`kick_queues`](Self::kick_queues).
    pub fn restore(
        mut device: Box<dyn VirtioDevice>,
        mem: GuestMemoryAtomic<GuestMemory>,
        state: &TransportState,
    ) -> Result<Self, Error> {
        if device.device_type() != state.device_type {
            return Err(Error::Mismatch("another device type"));
        }
        if device.features() != state.offered {
            return Err(Error::Mismatch("the device offers other features"));
        }
        if device.queue_max_sizes().len() != state.queues.len() {
            return Err(Error::Mismatch("another number of queues"));
        }
        let queues = state
            .queues
            .iter()
            .enumerate()
            .map(|(index, q)| Queue::try_from(QueueState::from(*q)).map_err(|source| Error::Queue { index, source }))
            .collect::<Result<Vec<_>, _>>()?;
        if state.status & super::regs::STATUS_FEATURES_OK != 0 {
            device.ack_features(state.acked);
        }
        device.restored();
        let queue_evts = (0..queues.len())
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        let interrupt = Arc::new(Interrupt::new().map_err(Error::EventFd)?);
        interrupt.restore(state.interrupt_status);
        let cell = DeviceCell { device, queues, active: state.active, mem };
        Ok(MmioTransport {
            cell: Arc::new(Mutex::new(cell)),
            interrupt,
            queue_evts,
            device_type: state.device_type,
            offered: state.offered,
            device_features_sel: state.device_features_sel,
            driver_features_sel: state.driver_features_sel,
            acked: state.acked,
            queue_sel: state.queue_sel,
            status: state.status,
        })
    }

    /// Signals every queue's eventfd once, as if the driver had notified it: the device thread
    /// then looks at every queue of an active device (after a restore, for notifications the
    /// snapshot caught in flight).
    pub fn kick_queues(&self) {
        for evt in &self.queue_evts {
            let _ = evt.write(1);
        }
    }
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn a_queue_is_its_bare_fields_in_the_snapshot_format() {
        let q =
            QueueSnapshot(QueueState { max_size: 256, next_avail: 3, size: 128, ready: true, ..Default::default() });
        let json = serde_json::to_value(q).unwrap();
        let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = vec![
            "avail_ring",
            "desc_table",
            "event_idx_enabled",
            "max_size",
            "next_avail",
            "next_used",
            "ready",
            "size",
            "used_ring",
        ];
        let mut got = keys.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(json["next_avail"], 3);
        assert_eq!(serde_json::from_value::<QueueSnapshot>(json).unwrap(), q);
    }
}

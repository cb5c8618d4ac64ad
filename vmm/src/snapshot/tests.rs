//! The state file's framing: round trip, and every refusal typed.

use std::path::Path;

use super::format::{self, FORMAT_VERSION, HEADER_LEN};
use super::state::{DevicesState, MemoryState, Snapshot};
use super::Error;
use crate::devices::serial::UartState;
use crate::kvm::state::VmState;

fn snapshot() -> Snapshot {
    Snapshot {
        vm: VmState { irqchips: Vec::new(), pit: Default::default(), clock: None },
        vcpus: Vec::new(),
        devices: DevicesState {
            serial: UartState::from(vm_superio::serial::SerialState::default()),
            clone_generation: 4,
            debug_exit: true,
            virtio: Vec::new(),
        },
        memory: MemoryState { bytes: 1 << 20, regions: vec![(0, 1 << 20)] },
    }
}

#[test]
fn a_state_file_round_trips() {
    let bytes = format::encode(&snapshot()).unwrap();
    let back = format::decode(&bytes, Path::new("s")).unwrap();
    assert_eq!(back.devices, snapshot().devices);
    assert_eq!(back.memory, snapshot().memory);
}

#[test]
fn a_file_of_another_kind_or_version_is_refused() {
    let mut bytes = format::encode(&snapshot()).unwrap();
    assert!(matches!(format::decode(b"{}", Path::new("s")), Err(Error::BadMagic(_))));
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    match format::decode(&bytes, Path::new("s")) {
        Err(Error::Version { found, supported }) => {
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION))
        }
        other => panic!("expected a version mismatch, got {other:?}"),
    }
}

#[test]
fn a_corrupted_or_truncated_state_is_refused() {
    let bytes = format::encode(&snapshot()).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x01;
    assert!(matches!(format::decode(&flipped, Path::new("s")), Err(Error::Checksum)));
    let short = &bytes[..bytes.len() - 1];
    assert!(matches!(format::decode(short, Path::new("s")), Err(Error::Truncated { .. })));
    assert!(matches!(format::decode(&bytes[..HEADER_LEN - 1], Path::new("s")), Err(Error::BadMagic(_))));
}

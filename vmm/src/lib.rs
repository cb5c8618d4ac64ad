//! pvisor-vmm: the virtual machine monitor that runs inside a vm-backend worker.
//!
//! The worker owns one microVM: the KVM fd, guest memory (a memfd, so a
//! vhost-user front-end can share it), the vCPU threads and the device
//! models. Device models are written once against `virtio-queue` and served
//! either behind this crate's virtio-mmio transport (guests on our own KVM
//! vCPUs) or as vhost-user back-ends (the QEMU TCG test engine).
//!
//! * [`vm`]: [`VmBuilder`] assembles a VM, [`Vm::run`] runs it to a typed [`VmExit`].
//! * [`kvm`]: the only module that calls KVM (VM, vCPUs, CPUID, MSRs).
//! * [`memory`], [`layout`]: guest RAM from a sealed memfd and the address map.
//! * [`boot`]: flat long-mode loader (test guests) and PVH direct boot (Linux).
//! * [`vcpu`]: the vCPU threads (seccomp filter, run loop, kicks); [`exit`]: how a VM ends;
//!   [`pause`]: the gate vCPUs park at while the VM is paused.
//! * [`bus`]: port-I/O and MMIO address spaces that vCPU exits are routed to.
//! * [`devices`]: serial console, i8042 reset, debug exit, virtio-mmio transport and devices.
//! * [`bench`](mod@bench): timing helpers for the benchmarks in `bench/`.
//! * [`initramfs`]: the newc cpio writer and the agent's initramfs (`/init`).
//! * [`snapshot`]: pause and save a VM (vCPUs, irqchip, devices, memory file), restore clones
//!   of it copy-on-write, each with a fresh seed and clock.
pub mod bench;
pub mod boot;
pub mod bus;
pub mod devices;
pub mod exit;
pub mod initramfs;
pub mod kvm;
pub mod layout;
pub mod memory;
pub mod pause;
pub mod snapshot;
pub mod vcpu;
pub mod vm;

pub use exit::VmExit;
pub use vm::{IoEventFd, VirtioMmioSlot, Vm, VmBuilder, VmConfig, VmHandle};

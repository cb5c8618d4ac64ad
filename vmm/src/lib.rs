//! pvisor-vmm: the virtual machine monitor that runs inside a vm-backend worker.
//!
//! The worker owns one microVM: the KVM fd, guest memory (a memfd, so a
//! vhost-user front-end can share it), the vCPU threads and the device
//! models. Device models are written once against `virtio-queue` and served
//! either behind this crate's virtio-mmio transport (guests on our own KVM
//! vCPUs) or as vhost-user back-ends (the QEMU TCG test engine).
//!
//! * [`bus`]: port-I/O and MMIO address spaces that vCPU exits are routed to.
//! * [`devices`]: serial console, virtio-mmio transport, virtio-blk, virtio-vsock.
//! * [`initramfs`]: the newc cpio writer and the agent's initramfs (`/init`).
pub mod bus;
pub mod devices;
pub mod initramfs;

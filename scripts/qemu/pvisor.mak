# The devices of pvisor's QEMU test engine (worker/src/vm/qemu.rs): the microvm machine, its
# virtio-mmio transports, and the vhost-user devices the worker serves.
CONFIG_MICROVM=y
CONFIG_VIRTIO_MMIO=y
CONFIG_VHOST_USER_BLK=y
CONFIG_VHOST_USER_VSOCK=y
CONFIG_VIRTIO_NET=y

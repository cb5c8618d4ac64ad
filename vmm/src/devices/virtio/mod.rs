//! Virtio devices: transport-independent models on `virtio-queue`, the
//! virtio-mmio transport, and vhost-user back-ends serving the same models.

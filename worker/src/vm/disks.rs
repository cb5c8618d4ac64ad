//! The vm sandbox's disks: the image (the pool's erofs view, read lazily
//! chunk by chunk, read-only) and the scratch disk (a sparse ext4 file the
//! overlay's upper lives on).
use crate::config::ImageDisk;
use crate::error::{Result, WorkerError};
use pvisor_images::erofs::ErofsView;
use pvisor_vmm::devices::virtio::block::{BlockBackend, FileBackend, ReadOnlyBackend};
use std::path::Path;
use std::sync::Arc;

/// The virtio-blk serial of each disk (`/sys/block/vdX/serial` in the guest).
pub const ROOT_ID: &str = "pvisor-root";
pub const SCRATCH_ID: &str = "pvisor-scratch";

/// Opens the image of `disk` from its pool (index and packs are opened now,
/// before the worker's filters; reads happen later, on demand).
pub fn open_root(disk: &ImageDisk) -> Result<Arc<dyn BlockBackend>> {
    let fail = |e: pvisor_images::Error| WorkerError::Start(format!("image {}: {e}", disk.image_id));
    let pool = pvisor_images::Pool::open(Path::new(&disk.pool_dir)).map_err(fail)?;
    let record = pool.resolve(&disk.image_id).map_err(fail)?;
    let view = pool.view(&record).map_err(fail)?;
    let erofs = ErofsView::new(Arc::new(view))
        .map_err(|e| WorkerError::Start(format!("image {}: erofs view: {e}", disk.image_id)))?;
    Ok(Arc::new(ReadOnlyBackend::new(erofs.len(), move |offset, buf| erofs.read_at(offset, buf))))
}

/// Opens the sandbox's scratch disk read-write.
pub fn open_scratch(path: &str) -> Result<Arc<dyn BlockBackend>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| WorkerError::sys(format!("scratch disk {path}"), e))?;
    let backend = FileBackend::new(file, false).map_err(|e| WorkerError::sys(format!("scratch disk {path}"), e))?;
    Ok(Arc::new(backend))
}

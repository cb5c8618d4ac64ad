//! Whole-file prefetch into the kernel's page cache.
//!
//! On these hosts a FUSE round trip is expensive, and a cold program start
//! is mostly READs of its executable and libraries, page fault by page
//! fault. So the first READ of a file (up to [`MAX_FILE`]) also hands the
//! file to a prefetch thread, which decompresses the rest of it and pushes
//! it into the page cache with `FUSE_NOTIFY_STORE`, on another core, while
//! the program runs: its later faults find the pages there, with no round
//! trip. The pages are shared by every sandbox of the image, like any page
//! cache of the mount.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, OnceLock};

use fuser::Notifier;

use super::attr::fuse_ino;
use crate::pool::index::{Data, Ino};
use crate::pool::view::ImageView;
use crate::pool::CHUNK_SIZE;

/// Largest file prefetched whole.
pub const MAX_FILE: u64 = 16 << 20;
/// Files queued at most; beyond that a first read just does not prefetch.
const QUEUE: usize = 256;

/// The reading side, owned by the file system.
pub struct Prefetch {
    /// One flag per inode: prefetch already asked for.
    asked: Vec<AtomicBool>,
    queue: Arc<OnceLock<SyncSender<Ino>>>,
}

impl Prefetch {
    pub fn new(inodes: usize) -> Prefetch {
        Prefetch { asked: (0..inodes).map(|_| AtomicBool::new(false)).collect(), queue: Arc::new(OnceLock::new()) }
    }

    /// Called on every READ: queues the file the first time, if it is worth it.
    pub fn first_read(&self, view: &ImageView, ino: Ino, end_of_read: u64) {
        let Some(queue) = self.queue.get() else { return };
        let Some(flag) = self.asked.get(ino as usize) else { return };
        if flag.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(Data::File { size, .. }) = view.index().inode(ino).map(|i| &i.data) {
            if *size > end_of_read && *size <= MAX_FILE {
                let _ = queue.try_send(ino);
            }
        }
    }

    /// Where the server plugs the thread in once the session exists.
    pub fn slot(&self) -> Arc<OnceLock<SyncSender<Ino>>> {
        self.queue.clone()
    }
}

/// Starts the prefetch thread for a mounted session.
pub fn start(slot: &OnceLock<SyncSender<Ino>>, view: Arc<ImageView>, notifier: Notifier) -> std::io::Result<()> {
    let (tx, rx) = sync_channel(QUEUE);
    std::thread::Builder::new().name("prefetch".into()).spawn(move || run(rx, &view, &notifier))?;
    let _ = slot.set(tx);
    Ok(())
}

fn run(rx: Receiver<Ino>, view: &ImageView, notifier: &Notifier) {
    let mut buf = vec![0u8; CHUNK_SIZE];
    while let Ok(ino) = rx.recv() {
        let mut off = 0u64;
        loop {
            let n = match view.read(ino, off, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // The kernel may have dropped the inode meanwhile: then stop.
            if notifier.store(fuse_ino(ino), off, &buf[..n]).is_err() {
                break;
            }
            off += n as u64;
        }
    }
}

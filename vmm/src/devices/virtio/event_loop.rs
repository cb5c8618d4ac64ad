//! The device thread: one epoll over every queue-notify eventfd of the
//! virtio-mmio devices and every device's own event source, dispatching to
//! the device models and raising their interrupts.
//!
//! Syscalls this thread makes (for its seccomp filter; observed with
//! `strace -f` on `blk_and_vsock_on_the_device_thread`, plus the paths that
//! test does not reach, marked *):
//!
//! * loop: `epoll_wait`; `read`/`write` on eventfds (queue notify, irqfd,
//!   exit, connect requests); `futex` (device locks, mpsc).
//! * virtio-blk: `pread64`, `pwrite64`, `fdatasync`* (FLUSH), `fallocate`*
//!   (DISCARD, WRITE_ZEROES: punch hole); an image disk (erofs view of the
//!   pool) also `fadvise64(POSIX_FADV_DONTNEED)` after each pack read
//!   (observed on `vmm/tests/virtio_guests.rs`).
//! * virtio-vsock: `epoll_wait` (timeout 0) and `epoll_ctl` on its inner
//!   set; `socket(AF_UNIX, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC)` and
//!   `connect` (guest connects); `accept4`* (listener); `recvfrom`,
//!   `sendto` (`MSG_NOSIGNAL`); `shutdown`* (guest half-close); `close`.
//! * virtio-net: `recvfrom` (`MSG_DONTWAIT | MSG_TRUNC`) and `sendto`
//!   (`MSG_DONTWAIT | MSG_NOSIGNAL`) on the link socket it was given,
//!   `epoll_wait` (timeout 0) and `epoll_ctl` on its own set; never
//!   `socket` or `connect` (checked under the filter by
//!   `net_on_the_device_thread_under_its_seccomp_filter`).
//! * allocator: `mmap`, `munmap`, `mprotect`, `madvise`.
//! * thread start/exit (before/after the filter): `rt_sigprocmask`,
//!   `sigaltstack`, `sched_getaffinity`, `prctl(PR_SET_NAME)`,
//!   `set_robust_list`, `rseq`, `gettid`, `exit`; debug builds also
//!   `fcntl(F_GETFD)` when an fd is dropped.
//!
//! [`EventLoop::spawn`] is the production path: it starts the thread,
//! which installs the `vmm_device` seccomp filter before it touches a
//! queue, and hands the loop back on [`DeviceThread::stop`], so the
//! devices' host resources are released outside the filter.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use pvisor_seccomp::BpfProgram;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{regs::INT_USED_BUFFER, DeviceCell, Interrupt, MmioTransport};

/// Token slot of a device's own event source (queue slots are 0..64).
const DEVICE_SLOT: u64 = 64;
/// Token of the exit eventfd.
const EXIT_TOKEN: u64 = u64::MAX;

/// Errors of the device thread.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("epoll: {0}")]
    Epoll(#[source] std::io::Error),
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("device thread seccomp filter: {0}")]
    Seccomp(#[source] pvisor_seccomp::Error),
    #[error("starting the device thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the device thread panicked")]
    Panicked,
}

struct Binding {
    cell: Arc<Mutex<DeviceCell>>,
    interrupt: Arc<Interrupt>,
    queue_evts: Vec<EventFd>,
}

/// The device thread's loop. Build it with [`EventLoop::add`] for each
/// transport, then call [`EventLoop::run`] on the thread.
pub struct EventLoop {
    epoll: Epoll,
    bindings: Vec<Binding>,
    exit: EventFd,
}

impl EventLoop {
    pub fn new() -> Result<Self, Error> {
        let epoll = Epoll::new().map_err(Error::Epoll)?;
        let exit = EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd)?;
        epoll
            .ctl(ControlOperation::Add, exit.as_raw_fd(), EpollEvent::new(EventSet::IN, EXIT_TOKEN))
            .map_err(Error::Epoll)?;
        Ok(Self { epoll, bindings: Vec::new(), exit })
    }

    /// Serves the device behind `transport` on this loop.
    pub fn add(&mut self, transport: &MmioTransport) -> Result<(), Error> {
        let index = self.bindings.len() as u64;
        let queue_evts = transport
            .queue_evts()
            .iter()
            .map(|e| e.try_clone().map_err(Error::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        for (queue, evt) in queue_evts.iter().enumerate() {
            let token = index << 8 | queue as u64;
            self.epoll
                .ctl(ControlOperation::Add, evt.as_raw_fd(), EpollEvent::new(EventSet::IN, token))
                .map_err(Error::Epoll)?;
        }
        let cell = transport.cell().clone();
        let device_fd = cell.lock().unwrap_or_else(PoisonError::into_inner).event_fd();
        if let Some(fd) = device_fd {
            self.epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, index << 8 | DEVICE_SLOT))
                .map_err(Error::Epoll)?;
        }
        self.bindings.push(Binding { cell, interrupt: transport.interrupt().clone(), queue_evts });
        Ok(())
    }

    /// An eventfd whose write makes [`EventLoop::run`] return.
    pub fn exit_evt(&self) -> Result<EventFd, Error> {
        self.exit.try_clone().map_err(Error::EventFd)
    }

    /// Starts the device thread `name` running this loop under the
    /// `vmm_device` seccomp filter (compiled here, installed by the thread
    /// before its first `epoll_wait`).
    pub fn spawn(self, name: &str) -> Result<DeviceThread, Error> {
        let filter = pvisor_seccomp::vmm_device_filter().map_err(Error::Seccomp)?;
        self.spawn_with(name, Some(filter))
    }

    /// [`EventLoop::spawn`] with another filter, or none (debugging only:
    /// `strace` of the thread's syscalls).
    pub fn spawn_with(mut self, name: &str, filter: Option<BpfProgram>) -> Result<DeviceThread, Error> {
        let exit = self.exit_evt()?;
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                if let Some(filter) = filter {
                    pvisor_seccomp::apply_to_thread(&filter).map_err(Error::Seccomp)?;
                }
                self.run()?;
                Ok(self)
            })
            .map_err(Error::Thread)?;
        Ok(DeviceThread { exit, handle: Some(handle) })
    }

    /// Runs until the exit eventfd is written, on the calling thread and
    /// under whatever filter it has (none in unit tests); the worker uses
    /// [`EventLoop::spawn`].
    pub fn run(&mut self) -> Result<(), Error> {
        while self.run_once(-1)? {}
        Ok(())
    }

    /// Waits up to `timeout_ms` (-1: forever) and handles what is ready.
    /// Returns false once exit was requested.
    pub fn run_once(&mut self, timeout_ms: i32) -> Result<bool, Error> {
        let mut events = [EpollEvent::default(); 32];
        let n = match self.epoll.wait(timeout_ms, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(Error::Epoll(e)),
        };
        for event in &events[..n] {
            let token = event.data();
            if token == EXIT_TOKEN {
                return Ok(false);
            }
            self.dispatch(token);
        }
        Ok(true)
    }

    fn dispatch(&mut self, token: u64) {
        let Some(binding) = self.bindings.get(usize::try_from(token >> 8).unwrap_or(usize::MAX)) else { return };
        let slot = token & 0xff;
        let mut cell = binding.cell.lock().unwrap_or_else(PoisonError::into_inner);
        let used = if slot == DEVICE_SLOT {
            cell.handle_event()
        } else {
            let Some(evt) = binding.queue_evts.get(slot as usize) else { return };
            // Drains the count; the fd is non-blocking.
            let _ = evt.read();
            cell.process_queue(slot as usize)
        };
        if used.any() && cell.needs_interrupt(used) {
            binding.interrupt.trigger(INT_USED_BUFFER);
        }
    }
}

/// A running device thread ([`EventLoop::spawn`]). Dropping it stops and
/// joins the thread.
pub struct DeviceThread {
    exit: EventFd,
    handle: Option<JoinHandle<Result<EventLoop, Error>>>,
}

impl DeviceThread {
    /// Asks the loop to return, waits for the thread, and hands back the
    /// loop (dropped by the caller, outside the thread's filter), or the
    /// error that ended it.
    pub fn stop(mut self) -> Result<EventLoop, Error> {
        match self.handle.take() {
            Some(handle) => join(&self.exit, handle),
            // Only `drop` takes the handle otherwise, and it runs after this.
            None => Err(Error::Panicked),
        }
    }
}

fn join(exit: &EventFd, handle: JoinHandle<Result<EventLoop, Error>>) -> Result<EventLoop, Error> {
    // Fails only on counter overflow, when an exit is already pending.
    let _ = exit.write(1);
    handle.join().map_err(|_| Error::Panicked)?
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            if let Err(e) = join(&self.exit, handle) {
                tracing::warn!("device thread: {e}");
            }
        }
    }
}

#[cfg(test)]
#[path = "event_loop_tests.rs"]
mod tests;

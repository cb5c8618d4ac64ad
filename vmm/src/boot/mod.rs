//! Putting a guest in memory and its boot vCPU in the state it expects.
//!
//! * [`flat`]: a raw binary at a low address, entered in 64-bit long mode with identity-mapped
//!   page tables the VMM builds: the test guests (PVM runs them natively, since everything sits
//!   at low virtual addresses).
//! * [`pvh`]: an uncompressed Linux `vmlinux` through its PVH entry note (`linux-loader`), with
//!   `hvm_start_info`, the memory map, the command line and an initramfs.
//! * [`mptable`]: the MP table that tells an ACPI-less Linux its CPUs and IOAPIC.
//! * [`gdt`], [`paging`]: the descriptor table and page tables.
//! * [`regs`]: the vCPU state of each entry mode.

pub mod flat;
pub mod gdt;
pub mod mptable;
pub mod paging;
pub mod pvh;
pub mod regs;

pub use regs::EntryState;

/// Errors of loading a guest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write to guest memory failed (the address is not RAM).
    #[error("writing the {what} to guest memory at {addr:#x}: {source}")]
    GuestMemory {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// The vm-memory error.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// The image does not fit in guest RAM below the MMIO gap.
    #[error("{what} of {size} bytes does not fit in guest RAM at {addr:#x}")]
    TooLarge {
        /// What.
        what: &'static str,
        /// Its size.
        size: u64,
        /// Where it was to go.
        addr: u64,
    },
    /// The kernel could not be loaded.
    #[error("loading the kernel: {0}")]
    Kernel(#[source] linux_loader::loader::Error),
    /// The kernel has no PVH entry note.
    #[error("the kernel has no PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY); build it with CONFIG_PVH")]
    NoPvhEntry,
    /// The command line is invalid or too long.
    #[error("kernel command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    /// Reading the kernel or initramfs failed.
    #[error("reading the {what}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The memory map has more entries than the layout has room for.
    #[error("the memory map has {0} entries, more than fit")]
    MemmapTooLarge(usize),
}

//! The boot vCPU's state for each entry mode.

use kvm_bindings::kvm_regs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::gdt::{self, CODE_SELECTOR, DATA_SELECTOR, TSS_SELECTOR};
use super::Error;
use crate::kvm::{self, Vcpu};
use crate::layout::GDT_START;

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1 is reserved and always set.
const RFLAGS_RESERVED: u64 = 1 << 1;

/// How the boot vCPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// 64-bit long mode with paging on (CR0.PE|PG, CR4.PAE, EFER.LME|LMA, CS.L).
    Long64 {
        /// `rip`.
        entry: u64,
        /// `rsp`.
        stack: u64,
        /// `cr3`: the identity map.
        cr3: u64,
    },
    /// 32-bit protected mode, paging off, flat segments: the PVH entry.
    Protected32 {
        /// `eip`: the kernel's PVH entry.
        entry: u64,
        /// `ebx`: the guest-physical address of `hvm_start_info`.
        start_info: u64,
    },
}

impl EntryState {
    fn long(&self) -> bool {
        matches!(self, EntryState::Long64 { .. })
    }

    /// Writes the GDT this state's selectors refer to.
    pub fn write_gdt(&self, mem: &GuestMemoryMmap) -> Result<(), Error> {
        for (i, entry) in gdt::table(self.long()).iter().enumerate() {
            let addr = GDT_START + i as u64 * 8;
            mem.write_obj(*entry, GuestAddress(addr)).map_err(|source| Error::GuestMemory {
                what: "GDT",
                addr,
                source,
            })?;
        }
        Ok(())
    }

    /// Puts `vcpu` in this state (the GDT must have been written).
    pub fn apply(&self, vcpu: &Vcpu) -> Result<(), kvm::Error> {
        let table = gdt::table(self.long());
        let mut sregs = vcpu.sregs()?;
        sregs.gdt.base = GDT_START;
        sregs.gdt.limit = (table.len() * 8 - 1) as u16;
        // No IDT: until the guest loads its own, any exception is a triple fault.
        sregs.idt.base = 0;
        sregs.idt.limit = 0;
        sregs.cs = gdt::segment(table[1], CODE_SELECTOR);
        let data = gdt::segment(table[2], DATA_SELECTOR);
        sregs.ds = data;
        sregs.es = data;
        sregs.fs = data;
        sregs.gs = data;
        sregs.ss = data;
        sregs.tr = gdt::segment(table[3], TSS_SELECTOR);
        let mut regs = kvm_regs { rflags: RFLAGS_RESERVED, ..Default::default() };
        match *self {
            EntryState::Long64 { entry, stack, cr3 } => {
                sregs.cr0 = CR0_PE | CR0_ET | CR0_NE | CR0_PG;
                sregs.cr3 = cr3;
                sregs.cr4 = CR4_PAE;
                sregs.efer = EFER_LME | EFER_LMA;
                regs.rip = entry;
                regs.rsp = stack;
                regs.rbp = stack;
            }
            EntryState::Protected32 { entry, start_info } => {
                sregs.cr0 = CR0_PE | CR0_ET;
                sregs.cr4 = 0;
                sregs.efer = 0;
                regs.rip = entry;
                regs.rbx = start_info;
            }
        }
        vcpu.set_sregs(&sregs)?;
        vcpu.set_regs(&regs)
    }
}

/* A PVH "kernel": entered in 32-bit protected mode with ebx = &hvm_start_info. Checks the
   start info's magic, prints the command line and the first memory map entry's type to COM1,
   and exits 0x20 (0x2e if ebx or the magic is wrong). */
.include "pvh_note.inc"
.set DEBUG_EXIT, 0x501

.section .text
.code32
.global pvh_start
pvh_start:
    cmp dword ptr [ebx], 0x336ec578     /* XEN_HVM_START_MAGIC_VALUE */
    jne bad
    mov esi, [ebx + 0x18]               /* cmdline_paddr (low half) */
    mov dx, COM1
print:
    lodsb
    test al, al
    jz printed
    out dx, al
    jmp print
printed:
    mov al, 10
    out dx, al
    mov esi, [ebx + 0x28]               /* memmap_paddr */
    mov al, [esi + 16]                  /* entry 0 type */
    add al, 0x30
    out dx, al
    mov al, 10
    out dx, al
    mov dx, DEBUG_EXIT
    mov al, 0x20
    out dx, al
    hlt
bad:
    mov dx, DEBUG_EXIT
    mov al, 0x2e
    out dx, al
    hlt

/* MMIO both ways against a test device at 0xc0000000 (in the MMIO gap, no RAM there): reads
   a 64-bit value at +0, writes it plus one at +8, writes 0xab at +0x10 (a byte), exits 0x13. */
.include "common.inc"
.section .text.start
.global _start
_start:
    mov rbx, 0xc0000000
    mov rax, [rbx]
    inc rax
    mov [rbx + 8], rax
    mov byte ptr [rbx + 0x10], 0xab
    exit 0x13

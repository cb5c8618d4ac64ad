/* Says goodbye, then jumps to 0xc0000000: an instruction fetch from the MMIO gap (no RAM, no
   device), which KVM cannot run or emulate. The VM fails with the registers and this line. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts msg
    mov rax, 0xc0000000
    jmp rax
.section .rodata
msg: .asciz "jumping into the MMIO gap\n"

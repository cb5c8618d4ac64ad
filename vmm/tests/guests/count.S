/* Says it runs, then counts forever with interrupts off: it increments the 64-bit counter at
   COUNTER (2 MiB, guest RAM above the image) in a loop that never exits to the VMM, so the
   counter moves exactly while the vCPU is inside KVM_RUN. */
.include "common.inc"
.set COUNTER, 0x200000
.section .text.start
.global _start
_start:
    puts msg
    cli
    mov rdi, COUNTER
1:  inc qword ptr [rdi]
    jmp 1b
.section .rodata
msg: .asciz "counting\n"

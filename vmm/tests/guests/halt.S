/* Says it runs, then halts with interrupts off: the vCPU sleeps in the kernel (in-kernel
   irqchip) until the host stops the VM. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts msg
    cli
1:  hlt
    jmp 1b
.section .rodata
msg: .asciz "halting\n"

/* Says it runs, then spins forever with interrupts off: only a stop from the host ends it. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts msg
    cli
1:  jmp 1b
.section .rodata
msg: .asciz "spinning\n"

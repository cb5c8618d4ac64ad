/* Writes a line to the serial console, then exits with code 0x11. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts msg
    exit 0x11
.section .rodata
msg: .asciz "hello from the guest\n"

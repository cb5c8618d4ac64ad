/* For the seccomp tests: writes a line, then writes to port 0x530, where the test's device
   makes a syscall on the vCPU thread, then writes "after probe" and exits 0x16. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts before
    mov dx, 0x530
    mov al, 1
    out dx, al
    puts after
    exit 0x16
.section .rodata
before: .asciz "before probe\n"
after: .asciz "after probe\n"

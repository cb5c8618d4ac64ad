/* Port I/O both ways: reads a 32-bit value from port 0x510 (a test device), writes it back
   plus one to port 0x514, reads a byte from an unclaimed port (expects 0xff) and reports it
   at 0x518, then exits with 0x12. */
.include "common.inc"
.section .text.start
.global _start
_start:
    mov dx, 0x510
    in eax, dx
    inc eax
    mov dx, 0x514
    out dx, eax
    mov dx, 0x5f0
    in al, dx
    mov dx, 0x518
    out dx, al
    exit 0x12

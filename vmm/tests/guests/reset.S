/* Asks the i8042 keyboard controller to pulse the reset line (Linux's reboot=k). */
.include "common.inc"
.section .text.start
.global _start
_start:
    mov al, 0xfe
    out 0x64, al
    exit 0xee   /* not reached */

/* Floods the console: 2048 lines of 63 'x' and a newline (128 KiB), then a last line
   "flood done", then exits 0x15. */
.include "common.inc"
.section .text.start
.global _start
_start:
    mov dx, COM1
    mov ecx, 2048
line:
    mov ebx, 63
    mov al, 0x78  /* 'x' */
char:
    out dx, al
    dec ebx
    jnz char
    mov al, 10    /* newline */
    out dx, al
    dec ecx
    jnz line
    puts done
    exit 0x15
.section .rodata
done: .asciz "flood done\n"

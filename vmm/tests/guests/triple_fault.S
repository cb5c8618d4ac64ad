/* An undefined instruction with no IDT: #UD, then #DF, then a triple fault (shutdown), the way
   Linux ends with reboot=t. */
.include "common.inc"
.section .text.start
.global _start
_start:
    puts msg
    ud2
    exit 0xee   /* not reached */
.section .rodata
msg: .asciz "about to triple fault\n"

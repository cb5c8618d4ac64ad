/* A PVH "kernel" that counts, for snapshots of the worker's own-VMM sandboxes: entered in
   32-bit protected mode, it prints "pvhcount\n", then "n XXXXXXXX\n" for n = 1, 2, 3, ...
   forever (8 hex digits, a short delay between lines). The count lives in ebp, so a restored
   clone prints the successor of the last count its source printed before the snapshot. */
.include "pvh_note.inc"
.set STACK, 0x1ff000
.set DELAY, 20000

.section .text
.code32
.global pvh_start
pvh_start:
    mov esp, STACK
    mov dx, COM1
    mov esi, offset banner
banner_char:
    lodsb
    test al, al
    jz count
    out dx, al
    jmp banner_char
count:
    xor ebp, ebp
next:
    inc ebp
    mov al, 'n'
    out dx, al
    mov al, ' '
    out dx, al
    mov eax, ebp
    call hex32
    mov al, 10
    out dx, al
    mov ecx, DELAY
wait:
    loop wait
    jmp next

/* Prints eax as 8 hex digits to COM1 (dx); clobbers eax, ebx, ecx. */
hex32:
    mov ecx, 8
digit:
    rol eax, 4
    mov ebx, eax
    and bl, 0xf
    add bl, '0'
    cmp bl, '9'
    jbe put
    add bl, 7
put:
    xchg eax, ebx
    out dx, al
    xchg eax, ebx
    loop digit
    ret

.section .rodata
banner:
    .asciz "pvhcount\n"

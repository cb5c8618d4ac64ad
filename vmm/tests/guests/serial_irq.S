/* The serial port's interrupt end to end: routes GSI 4 (COM1) through the IOAPIC to vector
   0x41 (PIC masked, local APIC on), enables the UART's "transmitter empty" interrupt
   (IER bit 1), which a 16550 raises at once since nothing is being sent, and halts. The handler reads IIR (acknowledging the interrupt),
   reports it at port 0x521, and exits 0x18. */
.include "common.inc"
.set IOAPIC, 0xfec00000
.set LAPIC, 0xfee00000
.set VECTOR, 0x41
.set GSI, 4
.section .text.start
.global _start
_start:
    lea rdi, [rip + idt]
    add rdi, VECTOR * 16
    lea rax, [rip + handler]
    mov word ptr [rdi], ax
    mov word ptr [rdi + 2], 0x08
    mov word ptr [rdi + 4], 0x8e00
    shr rax, 16
    mov word ptr [rdi + 6], ax
    shr rax, 16
    mov dword ptr [rdi + 8], eax
    lidt [rip + idtr]

    mov al, 0xff
    out 0x21, al
    out 0xa1, al
    mov rbx, LAPIC
    mov dword ptr [rbx + 0xf0], 0x1ff
    mov dword ptr [rbx + 0x80], 0
    mov rbx, IOAPIC
    mov dword ptr [rbx], 0x10 + 2 * GSI + 1
    mov dword ptr [rbx + 0x10], 0
    mov dword ptr [rbx], 0x10 + 2 * GSI
    mov dword ptr [rbx + 0x10], VECTOR

    sti
    mov dx, COM1 + 1        /* IER: transmitter holding register empty */
    mov al, 0x02
    out dx, al
wait:
    hlt
    jmp wait

handler:
    mov dx, COM1 + 2        /* IIR */
    in al, dx
    mov dx, 0x521
    out dx, al
    mov rbx, LAPIC
    mov dword ptr [rbx + 0xb0], 0
    exit 0x18

.section .rodata
.balign 8
idtr:
    .word 256 * 16 - 1
    .quad idt
.section .data
.balign 16
idt: .fill 256 * 16, 1, 0

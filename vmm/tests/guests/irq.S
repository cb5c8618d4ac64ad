/* An interrupt through the in-kernel IOAPIC: masks the legacy PIC (KVM routes GSIs 0-15 to
   both the PIC and the IOAPIC, and the PIC reaches the CPU through LINT0 as ExtINT), installs an IDT whose vector 0x40 handler writes
   0x77 to port 0x521, enables the local APIC, routes GSI 5 to vector 0x40 (edge, fixed,
   APIC 0), tells the host it is ready (port 0x520), then waits with sti; hlt. The handler
   sends EOI and exits with 0x14. */
.include "common.inc"
.set IOAPIC, 0xfec00000
.set LAPIC, 0xfee00000
.set VECTOR, 0x40
.set GSI, 5
.section .text.start
.global _start
_start:
    /* IDT entry for VECTOR: a 64-bit interrupt gate to `handler`, selector 0x08. */
    lea rdi, [rip + idt]
    add rdi, VECTOR * 16
    lea rax, [rip + handler]
    mov word ptr [rdi], ax          /* offset 15:0 */
    mov word ptr [rdi + 2], 0x08    /* code selector */
    mov word ptr [rdi + 4], 0x8e00  /* present, DPL 0, interrupt gate */
    shr rax, 16
    mov word ptr [rdi + 6], ax      /* offset 31:16 */
    shr rax, 16
    mov dword ptr [rdi + 8], eax    /* offset 63:32 */
    lidt [rip + idtr]

    /* Mask every line of both 8259 PICs, as an OS using the IOAPIC does. */
    mov al, 0xff
    out 0x21, al
    out 0xa1, al

    /* Local APIC: software enable (SVR bit 8), spurious vector 0xff; TPR 0. */
    mov rbx, LAPIC
    mov dword ptr [rbx + 0xf0], 0x1ff
    mov dword ptr [rbx + 0x80], 0

    /* IOAPIC redirection entry for GSI: high dword destination APIC 0, low dword the vector. */
    mov rbx, IOAPIC
    mov dword ptr [rbx], 0x10 + 2 * GSI + 1
    mov dword ptr [rbx + 0x10], 0
    mov dword ptr [rbx], 0x10 + 2 * GSI
    mov dword ptr [rbx + 0x10], VECTOR

    mov dx, 0x520
    mov al, 1
    out dx, al
wait:
    sti
    hlt
    jmp wait

handler:
    mov dx, 0x521
    mov al, 0x77
    out dx, al
    mov rbx, LAPIC
    mov dword ptr [rbx + 0xb0], 0   /* EOI */
    exit 0x14

.section .rodata
.balign 8
idtr:
    .word 256 * 16 - 1
    .quad idt
.section .data
.balign 16
idt: .fill 256 * 16, 1, 0

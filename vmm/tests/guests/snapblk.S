/* The virtio snapshot test guest: brings up virtio-blk (as virtio_blk.S), prints "ready", then
   reads sector k mod 64 for k = 0, 1, 2, ... one request at a time through the same three
   descriptors, printing "read KKKKKKKKKKKKKKKK VVVVVVVVVVVVVVVV\n" (k, the sector's first
   64-bit word) after each. A snapshot taken mid-run must carry the queue's ring positions:
   a restored clone's next request goes into avail slot k mod 16 and is answered in used slot
   k mod 16. Failure exits: 0x31 FEATURES_OK, 0x32 queue size, 0x33 DRIVER_OK, 0x34 a request's
   status was not OK. */
.include "common.inc"
.include "virtio_common.inc"
.set Q_DESC, 0x200000
.set Q_AVAIL, 0x201000
.set Q_USED, 0x202000
.set HDR, 0x203000
.set STATUSB, 0x203100
.set DATA, 0x210000
.set T_IN, 0

.section .text.start
.global _start
_start:
    mov rbx, VIRTIO_BASE
    negotiate 0x31
    queue 0, 16, Q_DESC, Q_AVAIL, Q_USED, 0x32
    driver_ok 0x33
    desc Q_DESC, 0, HDR, 16, D_NEXT, 1
    desc Q_DESC, 1, DATA, 512, D_NEXT | D_WRITE, 2
    desc Q_DESC, 2, STATUSB, 1, D_WRITE, 0
    mov rdi, Q_AVAIL
    mov word ptr [rdi], 0
    mov word ptr [rdi + 2], 0
    puts ready
    xor r12, r12                 /* k */

request:
    mov rdi, HDR
    mov dword ptr [rdi], T_IN
    mov dword ptr [rdi + 4], 0
    mov rax, r12
    and rax, 63
    mov [rdi + 8], rax
    mov byte ptr [STATUSB], 0xff
    /* avail.ring[k mod 16] = head 0, then avail.idx = k + 1 */
    mov rax, r12
    and rax, 15
    mov rdi, Q_AVAIL
    mov word ptr [rdi + 4 + rax * 2], 0
    lea rax, [r12 + 1]
    mov word ptr [rdi + 2], ax
    mov rbx, VIRTIO_BASE
    mov dword ptr [rbx + QUEUE_NOTIFY], 0
    lea r9, [r12 + 1]
    and r9, 0xffff
    wait_used Q_USED, r9d
    mov eax, [rbx + INTERRUPT_STATUS]
    mov [rbx + INTERRUPT_ACK], eax
    cmp byte ptr [STATUSB], 0
    je 8f
    exit 0x34
8:  puts read_word
    mov rax, r12
    call hex64
    call space
    mov rax, [DATA]
    call hex64
    call newline
    inc r12
    jmp request

.include "print.inc"

.section .rodata
ready: .asciz "ready\n"
read_word: .asciz "read "

/* virtio-blk through a split virtqueue: brings the device up (VERSION_1, queue 0 of 16
   entries), then submits four requests at once and notifies queue 0:
     head 0: IN  sectors 0..8       -> DATA0 (4096 bytes), status at STATUS0
     head 3: IN  sector PARAM       -> DATA1 (512 bytes),  status at STATUS0 + 1
     head 6: OUT sector 0 from WDATA (512 bytes),          status at STATUS0 + 2
     head 9: DISCARD sectors 8..16 (one segment),          status at STATUS0 + 3
   It polls the used ring until all four are back and InterruptStatus until the interrupt is
   raised, reports InterruptStatus, acks it, reports
   it again and exits 0x30. The test reads the data, the status bytes and the used ring from
   guest memory. Failure exits: 0x31 FEATURES_OK, 0x32 queue size, 0x33 DRIVER_OK. */
.include "common.inc"
.include "virtio_common.inc"
.set Q_DESC, 0x200000
.set Q_AVAIL, 0x201000
.set Q_USED, 0x202000
.set HDRS, 0x203000
.set STATUS0, 0x203100
.set DATA0, 0x210000
.set DATA1, 0x212000
.set WDATA, 0x213000
.set T_IN, 0
.set T_OUT, 1
.set T_DISCARD, 11
.set SEGMENT, 0x203200

.section .text.start
.global _start
_start:
    mov rbx, VIRTIO_BASE
    negotiate 0x31
    queue 0, 16, Q_DESC, Q_AVAIL, Q_USED, 0x32
    driver_ok 0x33

    /* Request headers: type, reserved, sector. */
    mov rdi, HDRS
    mov dword ptr [rdi], T_IN
    mov dword ptr [rdi + 4], 0
    mov qword ptr [rdi + 8], 0
    param
    mov dword ptr [rdi + 0x10], T_IN
    mov dword ptr [rdi + 0x14], 0
    mov [rdi + 0x18], rax
    mov dword ptr [rdi + 0x20], T_OUT
    mov dword ptr [rdi + 0x24], 0
    mov qword ptr [rdi + 0x28], 0
    mov dword ptr [rdi + 0x30], T_DISCARD
    mov dword ptr [rdi + 0x34], 0
    mov qword ptr [rdi + 0x38], 0
    /* The DISCARD segment: sector, sector count, flags. */
    mov rdi, SEGMENT
    mov qword ptr [rdi], 8
    mov dword ptr [rdi + 8], 8
    mov dword ptr [rdi + 12], 0
    /* Status bytes start as 0xff so the test sees that the device wrote them. */
    mov rdi, STATUS0
    mov dword ptr [rdi], 0xffffffff   /* four bytes: one per request */
    /* The data the OUT request would write. */
    mov rdi, WDATA
    mov rcx, 512
    mov al, 0xa5
    rep stosb

    desc Q_DESC, 0, HDRS, 16, D_NEXT, 1
    desc Q_DESC, 1, DATA0, 4096, D_NEXT | D_WRITE, 2
    desc Q_DESC, 2, STATUS0, 1, D_WRITE, 0
    desc Q_DESC, 3, HDRS + 0x10, 16, D_NEXT, 4
    desc Q_DESC, 4, DATA1, 512, D_NEXT | D_WRITE, 5
    desc Q_DESC, 5, STATUS0 + 1, 1, D_WRITE, 0
    desc Q_DESC, 6, HDRS + 0x20, 16, D_NEXT, 7
    desc Q_DESC, 7, WDATA, 512, D_NEXT, 8
    desc Q_DESC, 8, STATUS0 + 2, 1, D_WRITE, 0
    desc Q_DESC, 9, HDRS + 0x30, 16, D_NEXT, 10
    desc Q_DESC, 10, SEGMENT, 16, D_NEXT, 11
    desc Q_DESC, 11, STATUS0 + 3, 1, D_WRITE, 0

    /* Available ring: flags 0 (interrupts wanted), ring = heads 0, 3, 6, then idx. */
    mov rdi, Q_AVAIL
    mov word ptr [rdi], 0
    mov word ptr [rdi + 4], 0
    mov word ptr [rdi + 6], 3
    mov word ptr [rdi + 8], 6
    mov word ptr [rdi + 10], 9
    mov word ptr [rdi + 2], 4
    mov dword ptr [rbx + QUEUE_NOTIFY], 0

    wait_used Q_USED, 4
    /* The device publishes the used ring before it raises the interrupt: wait for the
       interrupt too (the guest runs with interrupts off, so the line stays pending). */
1:  mov eax, [rbx + INTERRUPT_STATUS]
    test eax, eax
    jz 1b
    report eax
    mov [rbx + INTERRUPT_ACK], eax
    mov eax, [rbx + INTERRUPT_STATUS]
    report eax
    exit 0x30

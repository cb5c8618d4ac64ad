/* virtio-vsock stream to a host port: reports the config's guest CID, brings up rx (0), tx (1)
   and event (2) queues of 8 entries, gives the device 8 rx buffers of 4 KiB, then
     1. sends OP_REQUEST from port GUEST_PORT to host port PARAM and reports the op of the
        first rx packet (OP_RESPONSE expected);
     2. sends OP_RW with the bytes at `payload`;
     3. waits for an OP_RW packet from the host (skipping credit updates) and writes its
        payload to COM1;
     4. sends OP_SHUTDOWN (both directions) and waits for the device's OP_RST, reports it.
   Exits 0x40. Failure exits: 0x41 FEATURES_OK, 0x42 queue size, 0x43 DRIVER_OK, 0x45 rx buffers used up. */
.include "common.inc"
.include "virtio_common.inc"
.set RX_DESC, 0x200000
.set RX_AVAIL, 0x201000
.set RX_USED, 0x202000
.set TX_DESC, 0x204000
.set TX_AVAIL, 0x205000
.set TX_USED, 0x206000
.set EV_DESC, 0x208000
.set EV_AVAIL, 0x209000
.set EV_USED, 0x20a000
.set RX_BUFS, 0x210000
.set TX_PKTS, 0x220000
.set QSIZE, 8
.set GUEST_CID, 3
.set HOST_CID, 2
.set GUEST_PORT, 0x4000
.set OP_REQUEST, 1
.set OP_RESPONSE, 2
.set OP_RST, 3
.set OP_SHUTDOWN, 4
.set OP_RW, 5
.set HDR_LEN, 44

/* Defined before its uses so that payload_len is a constant, not a memory operand. */
.section .rodata
payload:
    .ascii "hello from the guest"
.set payload_len, . - payload

.section .text.start
.global _start
_start:
    mov rbx, VIRTIO_BASE
    mov eax, [rbx + CONFIG]
    report eax
    param
    mov r12d, eax               /* host port */
    xor r13d, r13d              /* rx packets consumed */
    xor r14d, r14d              /* tx packets sent */

    negotiate 0x41
    queue 0, QSIZE, RX_DESC, RX_AVAIL, RX_USED, 0x42
    queue 1, QSIZE, TX_DESC, TX_AVAIL, TX_USED, 0x42
    queue 2, QSIZE, EV_DESC, EV_AVAIL, EV_USED, 0x42
    driver_ok 0x43

    /* rx: descriptor i = the 4 KiB buffer i, device-writable; all 8 available. */
    xor ecx, ecx
1:  mov rdi, RX_DESC
    mov eax, ecx
    shl eax, 4
    add rdi, rax
    mov eax, ecx
    shl eax, 12
    add eax, RX_BUFS
    mov [rdi], rax
    mov dword ptr [rdi + 8], 4096
    mov word ptr [rdi + 12], D_WRITE
    mov word ptr [rdi + 14], 0
    mov word ptr [RX_AVAIL + 4 + rcx * 2], cx
    inc ecx
    cmp ecx, QSIZE
    jb 1b
    mov word ptr [RX_AVAIL + 2], QSIZE
    mov dword ptr [rbx + QUEUE_NOTIFY], 0

    /* 1. Connect. */
    mov esi, OP_REQUEST
    xor edx, edx
    xor r8d, r8d
    call send
    call recv
    report eax

    /* 2. Our bytes. */
    lea rsi, [rip + payload]
    mov rdi, TX_PKTS + 1 * 0x1000 + HDR_LEN
    mov rcx, payload_len
    rep movsb
    mov esi, OP_RW
    mov edx, payload_len
    xor r8d, r8d
    call send

    /* 3. The host's reply, to the console. */
2:  call recv
    cmp eax, OP_RW
    jne 2b
    mov ecx, [rsi + 24]
    add rsi, HDR_LEN
    mov dx, COM1
3:  test ecx, ecx
    jz 4f
    lodsb
    out dx, al
    dec ecx
    jmp 3b
4:
    /* 4. Close both directions; the device ends the connection with RST. */
    mov esi, OP_SHUTDOWN
    xor edx, edx
    mov r8d, 3
    call send
5:  call recv
    cmp eax, OP_RST
    jne 5b
    report eax
    exit 0x40

/* send: tx packet number r14 (its own 4 KiB slot and descriptor) with op esi, payload length
   edx (payload already in place after the header), flags r8d; notifies queue 1. */
send:
    mov eax, r14d
    shl eax, 12
    lea rdi, [rax + TX_PKTS]
    mov qword ptr [rdi], GUEST_CID
    mov qword ptr [rdi + 8], HOST_CID
    mov dword ptr [rdi + 16], GUEST_PORT
    mov [rdi + 20], r12d
    mov [rdi + 24], edx
    mov word ptr [rdi + 28], 1              /* stream */
    mov [rdi + 30], si
    mov [rdi + 32], r8d
    mov dword ptr [rdi + 36], 0x10000       /* buf_alloc */
    mov dword ptr [rdi + 40], 0             /* fwd_cnt */
    mov eax, r14d
    shl eax, 4
    add eax, TX_DESC
    mov [rax], rdi
    add edx, HDR_LEN
    mov [rax + 8], edx
    mov word ptr [rax + 12], 0
    mov word ptr [rax + 14], 0
    mov word ptr [TX_AVAIL + 4 + r14 * 2], r14w
    inc r14d
    mov word ptr [TX_AVAIL + 2], r14w
    mov dword ptr [rbx + QUEUE_NOTIFY], 1
    ret

/* recv: waits for rx packet number r13; returns its op in eax and its buffer in rsi. */
recv:
    cmp r13d, QSIZE
    jb .Lrecv_wait
    exit 0x45
.Lrecv_wait:
    lea edx, [r13d + 1]
    wait_used RX_USED, edx
    mov eax, [RX_USED + 4 + r13 * 8]        /* used element: id */
    shl eax, 12
    lea rsi, [rax + RX_BUFS]
    inc r13d
    movzx eax, word ptr [rsi + 30]
    ret

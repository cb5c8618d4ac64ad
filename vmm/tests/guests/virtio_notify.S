/* Writes the virtio-mmio QueueNotify register (offset 0x50) of the first device window
   (0xd0000000) twice: queue 0, which an ioeventfd with datamatch 0 takes without an exit, and
   queue 1, which reaches the device as an MMIO write. Then reads the window's magic (+0) into
   port 0x540 and exits 0x17. */
.include "common.inc"
.section .text.start
.global _start
_start:
    mov rbx, 0xd0000000
    mov dword ptr [rbx + 0x50], 0
    mov dword ptr [rbx + 0x50], 1
    mov eax, [rbx]
    mov dx, 0x540
    out dx, eax
    exit 0x17

/* virtio-mmio discovery and feature negotiation, as a driver does it. Reports (port REPORT):
   MagicValue, Version, DeviceID, DeviceFeatures[31:0], DeviceFeatures[63:32], Status after
   FEATURES_OK, Status after DRIVER_OK. The driver's features bits 63:32 come from the test
   (PARAM): 1 accepts VERSION_1, 0 refuses it (the device must then refuse FEATURES_OK and so
   DRIVER_OK). Exits 0x21. */
.include "common.inc"
.include "virtio_common.inc"
.section .text.start
.global _start
_start:
    mov rbx, VIRTIO_BASE
    mov eax, [rbx + MAGIC]
    report eax
    mov eax, [rbx + VERSION]
    report eax
    mov eax, [rbx + DEVICE_ID]
    report eax

    mov dword ptr [rbx + STATUS], 0
    mov dword ptr [rbx + STATUS], S_ACKNOWLEDGE
    mov dword ptr [rbx + STATUS], S_ACKNOWLEDGE | S_DRIVER
    mov dword ptr [rbx + DEVICE_FEATURES_SEL], 0
    mov eax, [rbx + DEVICE_FEATURES]
    report eax
    mov dword ptr [rbx + DEVICE_FEATURES_SEL], 1
    mov eax, [rbx + DEVICE_FEATURES]
    report eax

    mov dword ptr [rbx + DRIVER_FEATURES_SEL], 0
    mov dword ptr [rbx + DRIVER_FEATURES], 0
    param
    mov dword ptr [rbx + DRIVER_FEATURES_SEL], 1
    mov [rbx + DRIVER_FEATURES], eax
    mov dword ptr [rbx + STATUS], S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK
    mov eax, [rbx + STATUS]
    report eax
    mov dword ptr [rbx + STATUS], S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK
    mov eax, [rbx + STATUS]
    report eax
    exit 0x21

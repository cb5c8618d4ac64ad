/* The KSM test guest: fills 8 MiB (2048 pages) with one non-zero pattern, page by page with a
   short `rep stosq` (one instruction a page: guest instructions are slow on this host's PVM),
   says so, then halts with interrupts off (the vCPU sleeps in the kernel until the host stops
   the VM). Every VM running it holds the same 2048 identical pages: what KSM should merge.
   Whole pages, not one word a page: zero-filled pages are special to KSM (use_zero_pages).

   Output (COM1): "ksmfill\n" at boot, "filled\n" once the 8 MiB holds the pattern. */
.include "common.inc"
.set FILL, 0x400000
.set FILL_END, 0xc00000
.set PATTERN, 0x6b736d2d66696c6c

.section .text.start
.global _start
_start:
    puts banner
    cld
    mov rdi, FILL
    mov rax, PATTERN
1:  mov rcx, 512
    rep stosq
    cmp rdi, FILL_END
    jb 1b
    puts filled
    cli
2:  hlt
    jmp 2b

.section .rodata
banner: .asciz "ksmfill\n"
filled: .asciz "filled\n"

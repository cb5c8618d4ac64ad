/* The snapshot test guest: writes a known word at the start of each page of 8 MiB (one word a
   page: guest instructions are slow on this host's PVM, about 2 us each), then steps a mixing
   sequence forever, printing every step, and watches the clone-identity device.

   Output lines (COM1):
     "snapcount\n", "filled\n" at boot;
     "gen GGGGGGGGGGGGGGGG seed S0S1S2S3 sum XXXXXXXXXXXXXXXX\n" at boot and whenever the
       generation changes (a restore): the generation, the 32-byte seed as four 64-bit words,
       and the wrapping sum of the page words (reading every page, writing none);
     "step NNNNNNNNNNNNNNNN XXXXXXXXXXXXXXXX\n" per step: n = n + 1, x = x * A + n.
   All numbers are 16 hex digits. State (n, x, last generation) lives at STATE. */
.include "common.inc"
.set STATE, 0x200000
.set FILL, 0x400000
.set FILL_END, 0xc00000
.set FILL_K, 0x9e3779b97f4a7c15
.set MIX_A, 6364136223846793005
.set X0, 0x243f6a8885a308d3
.set CLONE_ID, 0xcffff000

.section .text.start
.global _start
_start:
    puts banner
    mov rdi, FILL
    mov rbx, FILL_K
    mov rax, rbx
1:  mov [rdi], rax
    add rax, rbx
    add rdi, 4096
    cmp rdi, FILL_END
    jb 1b
    puts filled
    mov rdi, STATE
    mov qword ptr [rdi], 0
    mov rax, X0
    mov [rdi + 8], rax
    mov qword ptr [rdi + 16], -1

step:
    mov rbx, CLONE_ID
    mov rax, [rbx + 8]
    mov rdi, STATE
    cmp rax, [rdi + 16]
    je 2f
    mov [rdi + 16], rax
    call print_gen
2:  mov rdi, STATE
    mov rcx, [rdi]
    inc rcx
    mov [rdi], rcx
    mov rax, [rdi + 8]
    mov rdx, MIX_A
    imul rax, rdx
    add rax, rcx
    mov [rdi + 8], rax
    puts step_word
    mov rdi, STATE
    mov rax, [rdi]
    call hex64
    call space
    mov rdi, STATE
    mov rax, [rdi + 8]
    call hex64
    call newline
    jmp step

/* "gen G seed S0S1S2S3 sum X\n" */
print_gen:
    puts gen_word
    mov rbx, CLONE_ID
    mov rax, [rbx + 8]
    call hex64
    puts seed_word
    mov rbx, CLONE_ID
    mov rax, [rbx + 0x10]
    call hex64
    mov rbx, CLONE_ID
    mov rax, [rbx + 0x18]
    call hex64
    mov rbx, CLONE_ID
    mov rax, [rbx + 0x20]
    call hex64
    mov rbx, CLONE_ID
    mov rax, [rbx + 0x28]
    call hex64
    puts sum_word
    mov rdi, FILL
    xor rax, rax
3:  add rax, [rdi]
    add rdi, 4096
    cmp rdi, FILL_END
    jb 3b
    call hex64
    call newline
    ret

.include "print.inc"

.section .rodata
banner: .asciz "snapcount\n"
filled: .asciz "filled\n"
gen_word: .asciz "gen "
seed_word: .asciz " seed "
sum_word: .asciz " sum "
step_word: .asciz "step "

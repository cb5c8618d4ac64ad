/*
 * hold: the memory experiment's worker program (static; shipped into every
 * sandbox of both sides by the SDK's file upload).
 *
 *   hold MIB TOKEN DIR
 *
 * Maps MIB MiB of anonymous memory, fills it with data that is identical in
 * every instance (word i = mix64(SHARED_SEED + (i+1)*GAMMA)), verifies it word
 * by word, writes DIR/hold.pid and DIR/hold.ready ("identical WORDS FIRST LAST")
 * and blocks. On SIGUSR1 it rewrites every word with instance-unique data
 * (seed = FNV-1a of TOKEN), verifies it word by word and writes DIR/hold.unique
 * ("ok WORDS FIRST LAST" or "FAIL INDEX"). Then it blocks until killed.
 * FIRST and LAST are words 0 and WORDS-1 in hex, so the harness can check them
 * against its own computation of the sequence.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GAMMA 0x9E3779B97F4A7C15ULL
#define SHARED_SEED 0x5EED5EED5EED5EEDULL

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void fill(uint64_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = mix64(seed + (i + 1) * GAMMA);
}

/* Returns n on success, else the first bad index. */
static size_t verify(const volatile uint64_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != mix64(seed + (i + 1) * GAMMA)) return i;
    return n;
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    int fd = open(tmp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) _exit(3);
    if (write(fd, text, strlen(text)) < 0) _exit(3);
    close(fd);
    if (rename(tmp, path) != 0) _exit(3);
}

static volatile sig_atomic_t rewrite;
static void on_usr1(int sig) { (void)sig; rewrite = 1; }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: hold MIB TOKEN DIR\n");
        return 2;
    }
    size_t bytes = (size_t)strtoul(argv[1], NULL, 10) << 20;
    size_t n = bytes / sizeof(uint64_t);
    const char *dir = argv[3];
    uint64_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;

    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);

    char buf[256];
    fill(p, n, SHARED_SEED);
    size_t bad = verify(p, n, SHARED_SEED);
    if (bad != n) {
        snprintf(buf, sizeof buf, "FAIL %zu\n", bad);
        write_file(dir, "hold.ready", buf);
        return 1;
    }
    snprintf(buf, sizeof buf, "%d\n", (int)getpid());
    write_file(dir, "hold.pid", buf);
    snprintf(buf, sizeof buf, "identical %zu %016llx %016llx\n", n, (unsigned long long)p[0],
             (unsigned long long)p[n - 1]);
    write_file(dir, "hold.ready", buf);

    while (!rewrite) sigsuspend(&old);

    uint64_t seed = fnv1a(argv[2]);
    fill(p, n, seed);
    bad = verify(p, n, seed);
    if (bad != n)
        snprintf(buf, sizeof buf, "FAIL %zu\n", bad);
    else
        snprintf(buf, sizeof buf, "ok %zu %016llx %016llx\n", n, (unsigned long long)p[0],
                 (unsigned long long)p[n - 1]);
    write_file(dir, "hold.unique", buf);

    for (;;) pause();
}

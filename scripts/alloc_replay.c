/* Replays a trace of scripts/alloc_trace.c under whatever allocator runs it (LD_PRELOAD), with
 * the recorded threads in the recorded global order, writing a byte of every page of each block
 * as mimalloc-bench's rptest does; prints the peak resident size (VmHWM) and the CPU time. The
 * order is the same for every allocator, so the peak depends on placement alone (and on the
 * allocator's own background work): a deterministic comparison where the program's scheduling
 * swings its peak by tens of MiB from run to run. Build: `gcc -O2 -pthread -o alloc_replay
 * scripts/alloc_replay.c`; run: `LD_PRELOAD=... ./alloc_replay t.bin`. Frees of addresses the
 * trace never saw allocated (small blocks) are skipped. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

struct rec { uint8_t op, thread; uint64_t addr, size; } __attribute__((packed));

static struct rec *t;
static size_t n;
static _Atomic size_t next_op;
static void **block;     /* the block each allocation record got */
static long *freed_by;   /* for a free record: the allocation record it frees, or -1 */

static void *run(void *arg) {
    int me = (int)(intptr_t)arg;
    for (size_t i = 0; i < n; i++) {
        if (t[i].thread != me) continue;
        for (int spins = 0; atomic_load_explicit(&next_op, memory_order_acquire) != i;)
            if (++spins > 64) { sched_yield(); spins = 0; }
        if (t[i].op < 2) {
            size_t s = t[i].size;
            char *p = t[i].op == 0 ? malloc(s) : calloc(1, s);
            if (!p) { fprintf(stderr, "request %zu of %zu bytes failed\n", i, s); exit(1); }
            block[i] = p;
            for (size_t page = 0; page < s; page += 4096) p[page] = 1;
            p[s - 1] = 1;
        } else if (freed_by[i] >= 0) {
            free(block[freed_by[i]]);
        }
        atomic_store_explicit(&next_op, i + 1, memory_order_release);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s TRACE\n", argv[0]); return 2; }
    struct stat st;
    FILE *f = fopen(argv[1], "r");
    if (!f || stat(argv[1], &st)) { perror(argv[1]); return 1; }
    n = st.st_size / sizeof(struct rec);
    t = malloc(n * sizeof(struct rec));
    if (fread(t, sizeof(struct rec), n, f) != n) { perror("read"); return 1; }
    block = calloc(n, sizeof(void *));
    freed_by = malloc(n * sizeof(long));
    /* Match each free with the live allocation of its address (open addressing). */
    size_t hs = 1;
    while (hs < 2 * n) hs <<= 1;
    uint64_t *keys = calloc(hs, sizeof(uint64_t));
    long *vals = malloc(hs * sizeof(long));
    int nthreads = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = t[i].addr;
        size_t h = (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull) & (hs - 1);
        while (keys[h] && keys[h] != k) h = (h + 1) & (hs - 1);
        freed_by[i] = -1;
        if (t[i].thread + 1 > nthreads) nthreads = t[i].thread + 1;
        if (t[i].op < 2) { keys[h] = k; vals[h] = i; }
        else if (keys[h] == k && vals[h] >= 0) { freed_by[i] = vals[h]; vals[h] = -1; }
    }
    pthread_t th[256];
    if (nthreads > 256) { fprintf(stderr, "too many threads\n"); return 1; }
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], 0, run, (void *)(intptr_t)i);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], 0);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    FILE *s = fopen("/proc/self/status", "r");
    char line[256];
    long hwm = 0;
    while (s && fgets(line, sizeof line, s))
        if (!strncmp(line, "VmHWM:", 6)) hwm = atol(line + 6);
    printf("records %zu threads %d max RSS %ld MiB user %.2f s sys %.2f s\n", n, nthreads, hwm >> 10,
           ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    return 0;
}

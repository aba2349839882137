/* An LD_PRELOAD tracer of large requests, for replaying a program's allocations under any
 * allocator in the same order (scripts/alloc_replay.c): it records every malloc, calloc and
 * realloc of at least 64 KiB (the thread, the address, the size) and every free, in a buffer
 * mapped at start, written to $TRACE_OUT at exit. Build: `gcc -O2 -shared -fPIC -o
 * alloc_trace.so scripts/alloc_trace.c -ldl -lpthread`; run: `TRACE_OUT=t.bin
 * LD_PRELOAD=./alloc_trace.so PROGRAM`. Records are 18 bytes: op (0 malloc, 1 calloc, 2 free),
 * thread (in order of first record), address, size. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define MIN_SIZE 65536
#define MAX_RECORDS (1 << 24)

struct rec { uint8_t op, thread; uint64_t addr, size; } __attribute__((packed));

static struct rec *records;
static size_t nrecords;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int thread_index = -1;
static int nthreads;
static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
/* dlsym may call calloc before next_calloc is known: served from here, never freed. */
static char early[1 << 16];
static size_t early_used;

static void init(void) {
    if (next_malloc) return;
    next_malloc = dlsym(RTLD_NEXT, "malloc");
    next_calloc = dlsym(RTLD_NEXT, "calloc");
    next_realloc = dlsym(RTLD_NEXT, "realloc");
    next_free = dlsym(RTLD_NEXT, "free");
    records = mmap(0, MAX_RECORDS * sizeof(struct rec), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

static void record(int op, void *p, size_t size) {
    pthread_mutex_lock(&mu);
    if (thread_index < 0) thread_index = nthreads++;
    if (nrecords < MAX_RECORDS) records[nrecords++] = (struct rec){op, thread_index, (uint64_t)p, size};
    pthread_mutex_unlock(&mu);
}

void *malloc(size_t n) {
    init();
    void *p = next_malloc(n);
    if (p && n >= MIN_SIZE) record(0, p, n);
    return p;
}

void *calloc(size_t a, size_t b) {
    if (!next_calloc) {
        void *p = early + early_used;
        early_used += (a * b + 15) & ~(size_t)15;
        return p;
    }
    void *p = next_calloc(a, b);
    if (p && a * b >= MIN_SIZE) record(1, p, a * b);
    return p;
}

void *realloc(void *old, size_t n) {
    init();
    void *p = next_realloc(old, n);
    if (old) record(2, old, 0);
    if (p && n >= MIN_SIZE) record(0, p, n);
    return p;
}

void free(void *p) {
    if (!p || ((char *)p >= early && (char *)p < early + sizeof early)) return;
    init();
    record(2, p, 0);
    next_free(p);
}

__attribute__((destructor)) static void done(void) {
    const char *path = getenv("TRACE_OUT");
    if (!path || !records) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fwrite(records, sizeof(struct rec), nrecords, f);
    fclose(f);
}

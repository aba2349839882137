/* The allocator's own cost of large blocks in rptest's shape: `large_ops [LOOPS] [c]`.
 * Two threads, each with 64 slots; a loop frees 16 slots (every 17th), frees what the other
 * thread sent it, replaces 16 slots (every 7th) with blocks of 64 KiB-4 MiB (uniform, xorshift,
 * fixed seeds), and every second loop sends the other thread 16 more: rptest's
 * `2 0 1 2 ... 65536 4194304` without its memset and its touch of every page, so that what is
 * timed is the allocator's work (one byte per block is written: no page faults but the first
 * page's). With `c`: `calloc(1, n)` instead of `malloc(n)`. Prints the threads' CPU time per
 * operation (a malloc or a free). Run it with and without LD_PRELOAD, interleaved. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define SLOTS 64
#define OPS 16
#define MIN_SIZE (64ul << 10)
#define MAX_SIZE (4ul << 20)

typedef struct batch {
    void *p[OPS];
    struct batch *next;
} batch;

static int loops = 3000, use_calloc;
static _Atomic(batch *) inbox[2];
static _Atomic long total_ns, total_ops;

static unsigned long next_random(unsigned long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *take(unsigned long *s) {
    size_t n = MIN_SIZE + next_random(s) % (MAX_SIZE - MIN_SIZE);
    char *p = use_calloc ? calloc(1, n) : malloc(n);
    if (!p) {
        perror("large_ops");
        exit(1);
    }
    *(volatile char *)p = 1;
    return p;
}

static long drain(batch *b) {
    long ops = 0;
    while (b) {
        batch *next = b->next;
        for (int i = 0; i < OPS; i++) free(b->p[i]);
        free(b);
        ops += OPS + 1;
        b = next;
    }
    return ops;
}

static void *worker(void *arg) {
    long id = (long)arg, ops = 0;
    unsigned long s = 88172645463325252ul + id * 7777;
    void *slot[SLOTS] = {0};
    size_t fi = 0, ai = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (int l = 0; l < loops; l++) {
        for (int i = 0; i < OPS; i++, fi = (fi + 17) % SLOTS)
            if (slot[fi]) {
                free(slot[fi]);
                slot[fi] = NULL;
                ops++;
            }
        ops += drain(atomic_exchange(&inbox[id], NULL));
        for (int i = 0; i < OPS; i++, ai = (ai + 7) % SLOTS) {
            if (slot[ai]) {
                free(slot[ai]);
                ops++;
            }
            slot[ai] = take(&s);
            ops++;
        }
        if (l % 2 == 0) {
            batch *b = malloc(sizeof *b);
            ops++;
            for (int i = 0; i < OPS; i++, ops++) b->p[i] = take(&s);
            b->next = atomic_load(&inbox[!id]);
            while (!atomic_compare_exchange_weak(&inbox[!id], &b->next, b)) {
            }
        }
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    atomic_fetch_add(&total_ns, (t1.tv_sec - t0.tv_sec) * 1000000000l + t1.tv_nsec - t0.tv_nsec);
    atomic_fetch_add(&total_ops, ops);
    for (int i = 0; i < SLOTS; i++) free(slot[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) loops = atoi(argv[1]);
    use_calloc = argc > 2 && argv[2][0] == 'c';
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) drain(atomic_exchange(&inbox[i], NULL));
    printf("%.1f ns per operation (threads' CPU time), %ld operations\n", (double)total_ns / total_ops, (long)total_ops);
    return 0;
}

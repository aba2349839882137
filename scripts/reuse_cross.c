/* The hot reuse loop across a power of two: `reuse_cross B [c] [SECONDS]` runs
 * `p = malloc(n); memset(p, 7, n); free(p)` (with `c`: `calloc(1, n)`, whose zeroing counts as
 * the program's, then the memset) for about SECONDS (default 0.3), n uniform in
 * [B/2, 1.375*B] (xorshift, a fixed seed per thread), and prints the calls per CPU-second (one
 * call = one request and its free). With THREADS, that many threads run the loop at once, each for
 * SECONDS of its own CPU time. Time is the process's CPU time (its threads included, the
 * allocator's workers too), not the wall clock: on a machine shared with other work, being descheduled
 * would otherwise count. Run it with and without LD_PRELOAD=libfallow_preload.so:
 * scripts/reuse_cross.sh interleaves the two and prints medians. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double thread_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sixteen calls of the loop, the sizes drawn from the generator `x`. 0, or 1 if a request failed. */
static int sixteen(uint64_t *x, size_t lo, size_t span, int zero) {
    for (int i = 0; i < 16; i++) {
        *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
        size_t n = lo + *x % span;
        char *p = zero ? calloc(1, n) : malloc(n);
        if (!p) return 1;
        memset(p, 7, n);
        __asm__ volatile("" :: "r"(p) : "memory"); /* keep the pair */
        free(p);
    }
    return 0;
}

/* One thread's loop, on a cache line of its own (threads write `x` and `calls` at every call). */
struct loop { _Alignas(64) size_t lo; size_t span; int zero; double secs; uint64_t x; long calls; int failed; long most; };

static pthread_barrier_t warm;

/* A few warm-up calls, untimed: the first requests fault the memory in. */
static void warm_up(struct loop *l) {
    for (int w = 0; w < 2 && !l->failed; w++)
        l->failed = sixteen(&l->x, l->lo, l->span, l->zero);
}

/* One thread's timed calls, until it has spent `secs` of its own CPU time (so that threads
 * sharing a CPU each make their share of calls). */
static void timed(struct loop *l) {
    double t0 = thread_now();
    while (!l->failed && (l->most ? l->calls < l->most : thread_now() - t0 < l->secs)) {
        l->failed = sixteen(&l->x, l->lo, l->span, l->zero);
        l->calls += 16;
    }
}

static void *thread_main(void *arg) {
    warm_up(arg);
    pthread_barrier_wait(&warm);
    timed(arg);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s B [c|m] [SECONDS] [THREADS]\n", argv[0]); return 2; }
    size_t b = strtoul(argv[1], 0, 0);
    int zero = argc > 2 && argv[2][0] == 'c';
    double secs = argc > 3 ? atof(argv[3]) : 0.3;
    /* SECONDS as a count ("1500x"): that many calls, then the count is printed (for cachegrind,
     * scripts/reuse_l2.sh, where time means nothing). */
    long most = argc > 3 && strchr(argv[3], 'x') ? atol(argv[3]) : 0;
    int threads = argc > 4 ? atoi(argv[4]) : 1;
    if (threads < 1 || threads > 64) { fprintf(stderr, "THREADS: 1 to 64\n"); return 2; }
    size_t lo = b / 2, span = b * 11 / 8 - lo + 1;
    struct loop l[64];
    for (int i = 0; i < threads; i++)
        l[i] = (struct loop){ lo, span, zero, secs, 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * (uint64_t)i, 0, 0, most };
    double t0, t1;
    if (threads == 1) {
        warm_up(&l[0]);
        t0 = now();
        timed(&l[0]);
        t1 = now();
    } else {
        pthread_t t[64];
        pthread_barrier_init(&warm, 0, threads + 1);
        for (int i = 0; i < threads; i++)
            if (pthread_create(&t[i], 0, thread_main, &l[i])) return 1;
        pthread_barrier_wait(&warm);
        t0 = now();
        for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
        t1 = now();
    }
    long calls = 0;
    for (int i = 0; i < threads; i++) {
        if (l[i].failed) return 1;
        calls += l[i].calls;
    }
    if (most)
        printf("%ld\n", calls);
    else
        printf("%.0f\n", calls / (t1 - t0));
    return 0;
}

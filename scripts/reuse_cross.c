/* The hot reuse loop across a power of two: `reuse_cross B [c] [SECONDS]` runs
 * `p = malloc(n); memset(p, 7, n); free(p)` (with `c`: `calloc(1, n)`, whose zeroing counts as
 * the program's, then the memset) for about SECONDS (default 0.3), n uniform in
 * [B/2, 1.375*B] (xorshift, a fixed seed), and prints the calls per second (one call = one
 * request and its free). Time is the process's CPU time (its threads included, the allocator's
 * workers too), not the wall clock: on a machine shared with other work, being descheduled
 * would otherwise count. Run it with and without LD_PRELOAD=libfallow_preload.so:
 * scripts/reuse_cross.sh interleaves the two and prints medians. */
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

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s B [c|m] [SECONDS]\n", argv[0]); return 2; }
    size_t b = strtoul(argv[1], 0, 0);
    int zero = argc > 2 && argv[2][0] == 'c';
    double secs = argc > 3 ? atof(argv[3]) : 0.3;
    size_t lo = b / 2, span = b * 11 / 8 - lo + 1;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    long calls = 0;
    /* A few warm-up calls, untimed: the first requests fault the memory in. */
    for (int w = 0; w < 2; w++)
        if (sixteen(&x, lo, span, zero)) return 1;
    double t0 = now(), t;
    do {
        if (sixteen(&x, lo, span, zero)) return 1;
        calls += 16;
        t = now();
    } while (t - t0 < secs);
    printf("%.0f\n", calls / (t - t0));
    return 0;
}

/* Measurement behind the default FALLOW_THRESHOLD: for each size, N rounds of
 * {malloc, write every page, free} and {calloc, read every page, free}, interleaved with small
 * glibc allocations as a real program would have. Run once plainly (glibc) and once under the
 * preload with FALLOW_THRESHOLD=4096 (every size from fallow): tests/preload/threshold_sweep.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

int main(void) {
    size_t sizes[] = { 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20 };
    enum { N = 3000 };
    for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        void *keep[8] = {0};
        double t0 = now();
        for (int i = 0; i < N; i++) {
            volatile char *p = malloc(n);
            for (size_t j = 0; j < n; j += 4096) p[j] = 1;
            free(keep[i % 8]);
            keep[i % 8] = malloc(64 + i % 512);
            free((void *)p);
        }
        double t1 = now();
        for (int i = 0; i < N; i++) {
            volatile char *p = calloc(1, n);
            int s = 0;
            for (size_t j = 0; j < n; j += 4096) s += p[j];
            if (s) return 1;
            free((void *)p);
        }
        double t2 = now();
        for (int i = 0; i < 8; i++) free(keep[i]);
        printf("%5zu KiB: malloc+touch+free %6.2f us, calloc+read+free %6.2f us\n", n >> 10,
               (t1 - t0) / N * 1e6, (t2 - t1) / N * 1e6);
    }
    return 0;
}

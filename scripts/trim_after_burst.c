/* trim_after_burst MODE: how much of a heap a malloc_trim(0) gives back after a burst. Builds a
 * heap (MODE large: 512 blocks of 256 KiB-4 MiB, about 1 GiB; small: 4 M objects of 16-512 B,
 * about 1 GiB), every byte written, frees 90% of it at random, then calls malloc_trim(0); prints
 * the resident set after the build, after the frees and after the trim, and the trim's time.
 * gcc -O2 -o trim_after_burst scripts/trim_after_burst.c; LD_PRELOAD=... ./trim_after_burst small */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long a = 0, b = 0;
    if (!f || fscanf(f, "%lu %lu", &a, &b) != 2) b = 0;
    if (f) fclose(f);
    return b * 4096;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static unsigned long long s = 88172645463325252ULL;
static unsigned long long rnd(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "large";
    size_t n; size_t lo, hi;
    if (!strcmp(mode, "large")) { n = 512; lo = 256 << 10; hi = 4 << 20; }
    else { n = 4000000; lo = 16; hi = 512; }
    void **v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) { size_t sz = lo + rnd() % (hi - lo); v[i] = malloc(sz); memset(v[i], 1, sz); }
    size_t r0 = rss();
    for (size_t i = 0; i < n; i++) if (rnd() % 10) { free(v[i]); v[i] = 0; }
    size_t r1 = rss();
    double t = now();
    int got = malloc_trim(0);
    t = now() - t;
    size_t r2 = rss();
    printf("%s: rss built %zu MiB, after frees %zu, after trim %zu (returned %d) in %.1f ms\n", mode, r0 >> 20, r1 >> 20, r2 >> 20, got, t * 1e3);
    return 0;
}

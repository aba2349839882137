/* A malloc/free (or calloc/free, or malloc/realloc/free) loop for instruction counts under
 * callgrind: `pair_loop SIZE N [MODE]` makes N requests of n bytes, n uniform in [SIZE/2, SIZE]
 * (xorshift, a fixed seed), writes one byte of each and frees it. MODE: `m` malloc (default), `c`
 * calloc, `r` a 16-byte malloc then realloc to n; a `+` after it (`m+`) first makes one 1 MiB
 * request and keeps it, so that the preload's allocator exists and small requests are measured
 * with its arena in place. scripts/count-pair.sh runs it twice and divides the difference. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s SIZE N [m|c|r][+]\n", argv[0]); return 2; }
    size_t size = strtoul(argv[1], 0, 0);
    long n = atol(argv[2]);
    char mode = argc > 3 ? argv[3][0] : 'm';
    if (argc > 3 && argv[3][0] && argv[3][1] == '+') {
        char *big = malloc(1 << 20);
        if (!big) return 1;
        big[0] = 1;
        __asm__ volatile("" :: "r"(big) : "memory"); /* kept until exit */
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t len = size / 2 + x % (size / 2 + 1);
        char *p;
        if (mode == 'c') {
            p = calloc(1, len);
        } else if (mode == 'r') {
            p = malloc(16);
            if (!p) return 1;
            __asm__ volatile("" :: "r"(p) : "memory");
            p = realloc(p, len);
        } else {
            p = malloc(len);
        }
        if (!p) return 1;
        p[0] = 1;
        __asm__ volatile("" :: "r"(p) : "memory"); /* keep the pair: the compiler may drop it */
        free(p);
    }
    return 0;
}

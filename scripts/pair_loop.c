/* A malloc/free (or calloc/free) loop for instruction counts under callgrind: `pair_loop SIZE N
 * [c]` makes N requests of n bytes, n uniform in [SIZE/2, SIZE] (xorshift, a fixed seed), writes
 * one byte of each and frees it. scripts/count-pair.sh runs it twice and divides the difference. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s SIZE N [c]\n", argv[0]); return 2; }
    size_t size = strtoul(argv[1], 0, 0);
    long n = atol(argv[2]);
    int zero = argc > 3 && argv[3][0] == 'c';
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t len = size / 2 + x % (size / 2 + 1);
        char *p = zero ? calloc(1, len) : malloc(len);
        if (!p) return 1;
        p[0] = 1;
        __asm__ volatile("" :: "r"(p) : "memory"); /* keep the pair: the compiler may drop it */
        free(p);
    }
    return 0;
}

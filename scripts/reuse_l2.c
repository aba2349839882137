/* The hot reuse loop of scripts/reuse_cross.c by count, for cachegrind: `reuse_l2 B N [c]` runs
 * `p = malloc(n)` (with `c`: `calloc(1, n)`), `memset(p, 7, n)`, `free(p)` N times, n uniform in
 * [B/2, 1.375*B] (xorshift, the fixed seed of reuse_cross.c). scripts/reuse_l2.sh counts, under
 * cachegrind with its last level set to an L2's size, how often the memset leaves that cache:
 * whether the loop's requests stay in one region, as glibc's one reused chunk does. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t b = strtoul(argv[1], 0, 0), lo = b / 2, span = b * 11 / 8 - lo;
    long n = atol(argv[2]);
    int zero = argc > 3 && argv[3][0] == 'c';
    uint64_t x = 88172645463325252ULL;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t s = lo + x % span;
        char *p = zero ? calloc(1, s) : malloc(s);
        if (!p) return 1;
        memset(p, 7, s);
        __asm__ volatile("" :: "r"(p) : "memory"); /* keep the pair */
        free(p);
    }
    return 0;
}

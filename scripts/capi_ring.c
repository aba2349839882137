/* Instructions per fallow_free/fallow_alloc pair through the C library, for callgrind: a ring
 * of 64 live objects of 16-4096 bytes (the sizes of examples/slab_ring.rs), each step freeing
 * one and allocating one of another size and writing a byte of it, with small objects on; with
 * PAGES set in the environment, 4 KiB page blocks from an allocator with small objects off.
 *
 *   cargo build --release -p fallow-capi
 *   cc -O2 -Iinclude -o /tmp/capi_ring scripts/capi_ring.c -Ltarget/release -lfallow \
 *       -Wl,-rpath,$PWD/target/release
 *   valgrind --tool=callgrind --callgrind-out-file=/dev/null /tmp/capi_ring N
 *
 * Run for two values of N (with FALLOW_ZEROING=off FALLOW_REPORT=off); the difference of the
 * totals over the difference of N is one pair with start-up left out, the loop included. */
#include <stdio.h>
#include <stdlib.h>

#include "fallow.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int pages = getenv("PAGES") != NULL;
    fallow_allocator *a;
    if (fallow_create_with_options(NULL, NULL, pages ? 0 : FALLOW_CREATE_SMALL_OBJECTS, &a))
        return 1;
    size_t sizes[1024];
    unsigned long long x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 1024; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int shift = 4 + x % 8;
        size_t s = (1ul << shift) + (x >> 8) % (1ul << shift);
        sizes[i] = pages || s > 4096 ? 4096 : s;
    }
    void *ring[64];
    for (int i = 0; i < 64; i++)
        if (fallow_alloc(a, sizes[i], 0, 0, &ring[i]))
            return 3;
    for (long i = 0; i < n; i++) {
        if (fallow_free(a, ring[i & 63]) || fallow_alloc(a, sizes[i & 1023], 0, 0, &ring[i & 63]))
            return 4;
        *(volatile char *)ring[i & 63] = 1;
    }
    for (int i = 0; i < 64; i++)
        if (fallow_free(a, ring[i]))
            return 5;
    fallow_destroy(a);
    return 0;
}

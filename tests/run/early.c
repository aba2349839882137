/* A library whose constructor allocates, linked into `probe` for scripts/test-bench.sh: a library
 * the program needs is initialised before the preloaded one (which was loaded first), so this
 * request creates fallow's allocator before the preload's own initialisation runs, as
 * libstdc++'s exception pool does in every C++ program. `fallow run` must still sample it. */
#include <stdlib.h>
#include <string.h>

void *early_block;

__attribute__((constructor)) static void early(void) {
    early_block = malloc(1u << 20);
    if (early_block)
        memset(early_block, 1, 1u << 20);
}

/* glibc-simple's shape (mimalloc-bench's glibc-bench): `batch_loop N SIZE WRITE` makes N requests
 * of SIZE bytes, writes each byte of each object if WRITE is 1, then frees the first half in the
 * order they were made and the second half in reverse, 20,000,000 / N times; prints the time a
 * malloc/free pair took (ns, CLOCK_MONOTONIC, the program's writes included). Run it under each
 * peer's LD_PRELOAD (`FALLOW_SMALL=1` for fallow's small objects), interleaved, several times. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s N SIZE WRITE\n", argv[0]); return 2; }
    int n = atoi(argv[1]), size = atoi(argv[2]), write = atoi(argv[3]);
    if (n < 2 || n > 1600 || size < 1) { fprintf(stderr, "N in 2..1600, SIZE at least 1\n"); return 2; }
    long iters = 20000000L / n;
    char **arr = malloc(1600 * sizeof(char *));
    if (!arr) return 1;
    long t0 = now_ns();
    for (long j = 0; j < iters; j++) {
        for (int i = 0; i < n; i++) {
            arr[i] = malloc(size);
            if (!arr[i]) return 1;
            if (write)
                for (int g = 0; g < size; g++) arr[i][g] = (char)g;
        }
        for (int i = 0; i < n / 2; i++) free(arr[i]);
        for (int i = n - 1; i >= n / 2; i--) free(arr[i]);
    }
    printf("%.2f ns a pair\n", (now_ns() - t0) / (double)(iters * n));
    free(arr);
    return 0;
}

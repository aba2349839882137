/* The closing measurement of issue 7: calloc(256 MiB), touch every page, free, short pause,
 * repeated; run under each allocator by LD_PRELOAD (tests/preload/calloc_peers.sh).
 *   calloc_loop [iterations=20] [MiB=256] [pause_ms=50]
 * Prints the median and total wall time of the calloc+touch+free part, CPU time, and the
 * maximum resident set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    size_t size = (argc > 2 ? strtoull(argv[2], NULL, 0) : 256) << 20;
    int pause_ms = argc > 3 ? atoi(argv[3]) : 50;
    double *t = calloc(iters, sizeof *t), busy = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        volatile unsigned char *p = calloc(1, size);
        if (!p) { perror("calloc"); return 1; }
        unsigned sum = 0;
        for (size_t j = 0; j < size; j += 4096) { sum += p[j]; p[j] = (unsigned char)i; }
        if (sum) { fprintf(stderr, "calloc memory not zero\n"); return 1; }
        free((void *)p);
        t[i] = now() - t0;
        busy += t[i];
        usleep(pause_ms * 1000);
    }
    qsort(t, iters, sizeof *t, cmp);
    struct rusage ru; getrusage(RUSAGE_SELF, &ru);
    printf("median %.1f ms, total %.2f s busy, cpu %.2f s user + %.2f s sys, max RSS %ld MiB\n",
           t[iters / 2] * 1e3, busy, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
           ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, ru.ru_maxrss / 1024);
    return 0;
}

/* Many live blocks replaced at random (scripts/replace.sh): N blocks of sizes uniform in
 * [LO, HI] bytes are taken and written whole; then, ROUNDS times, a random half of them is freed
 * and as many taken again and written. Prints the wall time, the live bytes, the resident
 * memory at the end (/proc/self/statm), the peak (getrusage) and the minor page faults. A
 * fixed seed: every allocator gets the same requests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

static unsigned long long state = 88172645463325252ULL;

static unsigned long long next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long resident_kib(void) {
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * 4;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: replace LO HI N ROUNDS\n");
        return 2;
    }
    size_t lo = strtoull(argv[1], 0, 0), hi = strtoull(argv[2], 0, 0);
    int n = atoi(argv[3]), rounds = atoi(argv[4]);
    char **p = calloc(n, sizeof *p);
    size_t *len = calloc(n, sizeof *len), live = 0;
    if (!p || !len || hi < lo)
        return 2;
    double t0 = now();
    for (int r = -1; r < rounds; r++) {
        for (int i = 0; r >= 0 && i < n; i++)
            if (next() & 1) {
                free(p[i]);
                live -= len[i];
                p[i] = 0;
            }
        for (int i = 0; i < n; i++)
            if (!p[i]) {
                len[i] = lo + next() % (hi - lo + 1);
                p[i] = malloc(len[i]);
                if (!p[i])
                    return 1;
                memset(p[i], r + 2, len[i]);
                live += len[i];
            }
    }
    double t = now() - t0;
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("%.3f %zu %ld %ld %ld\n", t, live >> 20, resident_kib() >> 10, u.ru_maxrss >> 10, u.ru_minflt);
    return 0;
}

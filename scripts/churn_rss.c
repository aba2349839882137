/* Peak resident memory of a churn of large blocks in two threads: `churn_rss [STEPS] [m]`.
 * Each thread keeps 20 slots of blocks of 64 KiB-4 MiB (uniform, xorshift, fixed seeds) and
 * replaces 4 of them per step with `calloc(1, n)` (with `m`: `malloc(n)`), writing one byte in
 * every page, for STEPS steps (default 3000); one free in eight is of a block the other thread
 * put in. Prints the process's peak RSS (VmHWM) and the peak of live bytes the program asked
 * for, in KiB: their difference is what the allocator held beyond the live data at the worst
 * moment. Run it with and without LD_PRELOAD=libfallow_preload.so: scripts/churn_rss.sh
 * interleaves the two and prints medians. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 2
#define SLOTS 20
#define PER_STEP 4
#define MIN_SIZE (64u << 10)
#define MAX_SIZE (4u << 20)

static long steps = 3000;
static int plain_malloc;
static void *slots[THREADS][SLOTS];
static size_t sizes[THREADS][SLOTS];
static pthread_mutex_t locks[THREADS] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static long live, peak;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void count(long delta) {
    long now = __atomic_add_fetch(&live, delta, __ATOMIC_RELAXED);
    long old = __atomic_load_n(&peak, __ATOMIC_RELAXED);
    while (now > old && !__atomic_compare_exchange_n(&peak, &old, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void *churn(void *arg) {
    long t = (long)arg;
    uint64_t s = 88172645463325252ull + (uint64_t)t * 7919;
    for (long i = 0; i < steps; i++) {
        for (int k = 0; k < PER_STEP; k++) {
            int owner = next(&s) % 8 == 0 ? 1 - t : t;
            int j = next(&s) % SLOTS;
            size_t n = MIN_SIZE + next(&s) % (MAX_SIZE - MIN_SIZE);
            char *p = plain_malloc ? malloc(n) : calloc(1, n);
            if (!p) {
                perror("churn_rss");
                exit(1);
            }
            for (size_t o = 0; o < n; o += 4096)
                p[o] = 1;
            pthread_mutex_lock(&locks[owner]);
            void *old = slots[owner][j];
            long delta = (long)n - (long)sizes[owner][j];
            slots[owner][j] = p;
            sizes[owner][j] = n;
            count(delta);
            pthread_mutex_unlock(&locks[owner]);
            free(old);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        steps = atol(argv[1]);
    plain_malloc = argc > 2 && argv[2][0] == 'm';
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, churn, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    long hwm = 0;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            hwm = atol(line + 6);
    printf("%ld %ld\n", hwm, peak >> 10);
    return 0;
}

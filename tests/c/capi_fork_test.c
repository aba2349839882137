/* Test of the C API around fork: allocators made by fallow_create* are locked around every
 * fork of the process by the library's own handlers, so that a threaded program can fork while
 * other threads are inside them (a refill, a large block, the statistics, a small-object span,
 * a worker's batch) and the child can use every one of them. Each child allocates and frees
 * from every allocator, checks what it reads, sees a background worker restarted, and leaves by
 * _exit(0) within an alarm() (a child stuck on a lock dies of SIGALRM and fails the test). Also
 * allocators created and destroyed in a loop while another thread forks (far more than a page of
 * the registry holds, their address space given back), and more allocators alive at once than a
 * page of the registry holds. Built against libfallow.so and libfallow.a by scripts/test-capi.sh
 * (and against the installed library by scripts/test-install.sh). Prints "ok <name>" per test;
 * exit status = number of failures. */
#define _GNU_SOURCE
#include <errno.h>
#include <fallow.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "capi_check.h"
#include "task_count.h"

#define KiB 1024UL
#define MiB (1024UL * 1024)
#define SMALL_MAX (16 * KiB)
#define CHILD_ALARM_S 30 /* a child's work takes milliseconds: the bound only turns a hang into a failure */

static uint64_t next_rand(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* An allocator of arena_mib MiB with the largest block 4 KiB << max_order, small objects on or
 * off, the background workers as the defaults have them (on) unless FALLOW_REPORT and
 * FALLOW_ZEROING say otherwise (from_env), and the per-thread caches on or off. */
static fallow_allocator *make(size_t arena_mib, unsigned max_order, int small, int from_env, int cache) {
    fallow_config c;
    fallow_config_init(&c);
    c.arena_size = arena_mib * MiB;
    c.max_order = max_order;
    fallow_cache_config cc;
    fallow_cache_config_init(&cc);
    cc.cache = cache;
    unsigned options = (small ? FALLOW_CREATE_SMALL_OBJECTS : 0) | (from_env ? FALLOW_CREATE_FROM_ENV : 0);
    fallow_allocator *a = NULL;
    int rc = fallow_create_with_options(&c, &cc, options, &a);
    if (rc != 0) {
        fprintf(stderr, "  create: %s\n", fallow_last_error());
        return NULL;
    }
    return a;
}


/* Address space of this process in MiB (/proc/self/statm, first figure). */
static long vm_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1;
    if (!f || fscanf(f, "%ld", &pages) != 1) pages = -1;
    if (f) fclose(f);
    return pages < 0 ? -1 : pages * 4096 / (long)MiB;
}

/* In a child: a large zeroed block (checked zero, written, read back) and, with small objects,
 * objects of sizes up to 16 KiB written and read back, all freed; the statistics. 0 when all
 * went as expected, else a line number. */
static int use(fallow_allocator *a, int small, size_t large) {
    unsigned char *p;
    if (fallow_alloc(a, large, 0, FALLOW_ZERO, (void **)&p)) return __LINE__;
    for (size_t i = 0; i < large; i += 4096) if (p[i] || p[i + 4095]) return __LINE__;
    memset(p, 0x3C, large);
    if (p[large / 2] != 0x3C || fallow_free(a, p)) return __LINE__;
    if (small) {
        enum { K = 64 };
        unsigned char *o[K];
        for (int k = 0; k < K; k++) {
            size_t n = 1 + (size_t)k * 257 % SMALL_MAX;
            if (fallow_alloc(a, n, 0, 0, (void **)&o[k])) return __LINE__;
            memset(o[k], k, n);
        }
        for (int k = 0; k < K; k++) {
            size_t n = 1 + (size_t)k * 257 % SMALL_MAX;
            if (o[k][0] != k || o[k][n - 1] != k || fallow_free(a, o[k])) return __LINE__;
        }
    }
    fallow_stats s;
    if (fallow_stats_read_size(a, &s, sizeof s)) return __LINE__;
    return 0;
}

/* Wait for child pid; 0 if it exited 0, else 1 with the reason on stderr. */
static int reap(pid_t pid, int round) {
    int st;
    if (waitpid(pid, &st, 0) != pid) {
        fprintf(stderr, "  waitpid: %s\n", strerror(errno));
        return 1;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (WIFSIGNALED(st))
        fprintf(stderr, "  child of fork %d: signal %d%s\n", round, WTERMSIG(st),
                WTERMSIG(st) == SIGALRM ? " (stuck past the alarm: a lock held at the fork)" : "");
    else
        fprintf(stderr, "  child of fork %d: exit %d (the line of the failed check in use(), or the code)\n", round, WEXITSTATUS(st));
    return 1;
}

/* ---- fork while threads allocate ---- */

static atomic_int stop;

struct hammer { fallow_allocator *large, *small; int kind; uint64_t seed; int rc; atomic_long rounds; };

enum { RING_SMALL, BLOCKS_LOCKED, BLOCKS_CACHED_AND_STATS, KINDS };

/* One thread's work until `stop`, by kind: small objects from the small allocator in a ring
 * (spans taken and given back under the slab's lock); large blocks past the per-thread caches
 * from both allocators (every request and free under the allocator's lock); blocks the caches
 * serve (refills and drains under the lock), some zeroed, and the statistics of both (both
 * locks). Contents checked. */
static void *hammer(void *arg) {
    struct hammer *h = arg;
    enum { RING = 64 };
    unsigned char *ring[RING] = {0};
    size_t size[RING] = {0};
    uint64_t x = h->seed;
    for (long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        uint64_t r = next_rand(&x);
        int slot = (int)(r % RING);
        fallow_allocator *a = (r >> 40) & 1 ? h->large : h->small;
        unsigned char *p;
        size_t n;
        switch (h->kind) {
        case RING_SMALL:
            if (ring[slot]) {
                unsigned char v = (unsigned char)slot;
                if (ring[slot][0] != v || ring[slot][size[slot] - 1] != v || fallow_free(h->small, ring[slot])) { h->rc = __LINE__; return NULL; }
            }
            size[slot] = 1 + (r >> 8) % SMALL_MAX;
            if (fallow_alloc(h->small, size[slot], 0, 0, (void **)&ring[slot])) { h->rc = __LINE__; return NULL; }
            memset(ring[slot], slot, size[slot]);
            break;
        case BLOCKS_LOCKED:
            n = 16 * MiB + (r >> 20) % (16 * MiB);
            if (fallow_alloc(a, n, 0, 0, (void **)&p)) { h->rc = __LINE__; return NULL; }
            p[0] = 1; p[n - 1] = 2;
            if (p[0] != 1 || fallow_free(a, p)) { h->rc = __LINE__; return NULL; }
            break;
        default: {
            n = 64 * KiB + (r >> 20) % (4 * MiB);
            if (fallow_alloc(a, n, 0, (r >> 41) & 1 ? FALLOW_ZERO : 0, (void **)&p)) { h->rc = __LINE__; return NULL; }
            if (((r >> 41) & 1) && (p[0] || p[n - 1])) { h->rc = __LINE__; return NULL; }
            p[0] = 1; p[n - 1] = 2;
            if (fallow_free(a, p)) { h->rc = __LINE__; return NULL; }
            fallow_stats s;
            if (fallow_stats_read_size(h->large, &s, sizeof s) || fallow_stats_read_size(h->small, &s, sizeof s)) { h->rc = __LINE__; return NULL; }
        }
        }
        atomic_fetch_add_explicit(&h->rounds, 1, memory_order_relaxed);
    }
    for (int k = 0; k < RING; k++) if (ring[k] && fallow_free(h->small, ring[k])) h->rc = __LINE__;
    return NULL;
}

/* Threads that start, take small objects, free half and end (their heaps given up under the
 * slab's lock); this thread frees the other half (remote frees into given-up heaps). */
struct spawner { fallow_allocator *a; int rc; };
struct brief { fallow_allocator *a; void *p[100]; int rc; };

static void *brief_thread(void *arg) {
    struct brief *b = arg;
    for (int i = 0; i < 100; i++) if (fallow_alloc(b->a, 16 + (size_t)i * 97, 0, 0, &b->p[i])) { b->rc = __LINE__; return NULL; }
    for (int i = 0; i < 100; i += 2) if (fallow_free(b->a, b->p[i])) b->rc = __LINE__;
    return NULL;
}

static void *spawner(void *arg) {
    struct spawner *s = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed) && !s->rc) {
        struct brief b = { .a = s->a };
        pthread_t t;
        if (pthread_create(&t, NULL, brief_thread, &b) || pthread_join(t, NULL) || b.rc) { s->rc = b.rc ? b.rc : __LINE__; break; }
        for (int i = 1; i < 100; i += 2) if (fallow_free(s->a, b.p[i])) s->rc = __LINE__;
    }
    return NULL;
}

static int test_fork_while_threads_allocate(void) {
    enum { HAMMERS = KINDS, FORKS = 100 };
    fallow_allocator *large = make(512, 14, 0, 0, 1), *small = make(512, 14, 1, 0, 1);
    CHECK(large && small, "create");
    /* Blocks of the main thread, alive across the forks: the child reads and frees its copies. */
    unsigned char *pl, *ps;
    CHECK(fallow_alloc(large, 1 * MiB, 0, 0, (void **)&pl) == 0 && fallow_alloc(small, 1000, 0, 0, (void **)&ps) == 0, "before");
    memset(pl, 0x5A, 1 * MiB);
    memset(ps, 0xA5, 1000);
    atomic_store(&stop, 0);
    struct hammer h[HAMMERS];
    pthread_t th[HAMMERS + 1];
    for (int i = 0; i < HAMMERS; i++) {
        h[i] = (struct hammer){ .large = large, .small = small, .kind = i, .seed = 0x9E3779B97F4A7C15ull * (i + 1) };
        CHECK(pthread_create(&th[i], NULL, hammer, &h[i]) == 0, "thread");
    }
    struct spawner sp = { .a = small };
    CHECK(pthread_create(&th[HAMMERS], NULL, spawner, &sp) == 0, "thread");
    int bad = 0, f;
    for (f = 0; f < FORKS && !bad; f++) {
        /* Fork only once the threads are at work, so that they are in the allocators. */
        long seen = atomic_load(&h[f % HAMMERS].rounds);
        while (atomic_load(&h[f % HAMMERS].rounds) < seen + 20 && !h[f % HAMMERS].rc) sched_yield();
        pid_t pid = fork();
        if (pid == 0) {
            alarm(CHILD_ALARM_S);
            for (size_t i = 0; i < 1 * MiB; i += 4096) if (pl[i] != 0x5A) _exit(201);
            if (ps[0] != 0xA5 || ps[999] != 0xA5) _exit(202);
            if (fallow_free(large, pl) || fallow_free(small, ps)) _exit(203);
            int r = use(large, 0, 3 * MiB);
            if (!r) r = use(small, 1, 3 * MiB);
            if (r) _exit(r);
            /* A block past the caches goes to the lists, which makes work for the reporting
             * worker: the child starts its own (the parent's do not exist here; the child has
             * no other thread). */
            void *p;
            if (fallow_alloc(large, 16 * MiB, 0, 0, &p)) _exit(205);
            memset(p, 1, 16 * MiB);
            if (fallow_free(large, p)) _exit(206);
            if (task_count() < 2) _exit(207);
            /* A new allocator, and the inherited ones destroyed. */
            fallow_allocator *c = make(64, 12, 1, 0, 1);
            if (!c || use(c, 1, 1 * MiB)) _exit(208);
            fallow_destroy(c);
            fallow_destroy(large);
            fallow_destroy(small);
            _exit(0);
        }
        CHECK(pid > 0, "fork: %s", strerror(errno));
        bad += reap(pid, f);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i <= HAMMERS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < HAMMERS; i++) CHECK(h[i].rc == 0, "hammer %d failed at line %d", i, h[i].rc);
    CHECK(sp.rc == 0, "spawner failed at line %d", sp.rc);
    CHECK(bad == 0, "a child of fork %d of %d failed", f - 1, FORKS);
    CHECK(fallow_free(large, pl) == 0 && fallow_free(small, ps) == 0, "free after");
    fallow_destroy(large);
    fallow_destroy(small);
    printf("  %d forks while %d threads allocated (%ld rounds) and threads came and went\n", f, HAMMERS,
           atomic_load(&h[0].rounds) + atomic_load(&h[1].rounds) + atomic_load(&h[2].rounds));
    return 0;
}

/* ---- allocators created and destroyed in a loop while another thread forks ---- */

struct creator { int rounds; int rc; atomic_int done; };

/* Create, use and destroy allocators (workers on: their threads are joined at each destroy),
 * a ring of three alive at once, so that slots are freed out of order. */
static void *creator(void *arg) {
    struct creator *c = arg;
    enum { ALIVE = 3 };
    fallow_allocator *ring[ALIVE] = {0};
    for (int i = 0; i < c->rounds && !c->rc; i++) {
        int k = i % ALIVE;
        fallow_destroy(ring[k]);
        ring[k] = make(64, 12, i % 2, 0, 1);
        if (!ring[k]) { c->rc = __LINE__; break; }
        unsigned char *p;
        if (fallow_alloc(ring[k], 1 * MiB + 100, 0, FALLOW_ZERO, (void **)&p) || p[1 * MiB + 99]) { c->rc = __LINE__; break; }
        memset(p, 7, 1 * MiB);
        if (fallow_free(ring[k], p)) c->rc = __LINE__;
    }
    for (int k = 0; k < ALIVE; k++) fallow_destroy(ring[k]);
    atomic_store(&c->done, 1);
    return NULL;
}

static int test_fork_while_creating_and_destroying(void) {
    enum { ROUNDS = 1000, MIN_FORKS = 20 };
    long vm0 = vm_mib();
    fallow_allocator *kept = make(256, 14, 1, 0, 1);
    CHECK(kept, "create");
    atomic_store(&stop, 0);
    struct hammer h = { .large = kept, .small = kept, .kind = BLOCKS_CACHED_AND_STATS, .seed = 12345 };
    struct creator c = { .rounds = ROUNDS };
    pthread_t th, tc;
    CHECK(pthread_create(&th, NULL, hammer, &h) == 0 && pthread_create(&tc, NULL, creator, &c) == 0, "threads");
    int bad = 0, f = 0;
    for (; (!atomic_load(&c.done) || f < MIN_FORKS) && !bad; f++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(CHILD_ALARM_S);
            int r = use(kept, 1, 2 * MiB);
            if (r) _exit(r);
            void *p;
            if (fallow_alloc(kept, 16 * MiB, 0, 0, &p)) _exit(205);
            memset(p, 1, 16 * MiB);
            if (fallow_free(kept, p)) _exit(206);
            if (task_count() < 2) _exit(207);
            fallow_allocator *n = make(64, 12, 1, 0, 1);
            if (!n || use(n, 1, 1 * MiB)) _exit(208);
            fallow_destroy(n);
            fallow_destroy(kept);
            _exit(0);
        }
        CHECK(pid > 0, "fork: %s", strerror(errno));
        bad += reap(pid, f);
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    pthread_join(tc, NULL);
    CHECK(h.rc == 0 && c.rc == 0, "hammer failed at line %d, creator at line %d", h.rc, c.rc);
    CHECK(bad == 0, "a child of fork %d failed", f - 1);
    fallow_destroy(kept);
    /* Each allocator reserved 64 MiB: kept by the registry past its destruction, a thousand
     * would still hold 64 GiB. Slack for the threads' own malloc arenas and stacks. */
    long vm1 = vm_mib();
    CHECK(vm0 > 0 && vm1 - vm0 < 1024, "address space %ld MiB before, %ld MiB after %d allocators made and destroyed", vm0, vm1, ROUNDS);
    printf("  %d allocators made and destroyed while %d forks; address space %ld -> %ld MiB\n", ROUNDS, f, vm0, vm1);
    return 0;
}

/* ---- more allocators alive at once than a page of the registry holds ---- */

struct cycler { fallow_allocator **all; int n; int rc; atomic_long rounds; };

/* Every allocator of its share in turn, without a per-thread cache: each request takes its
 * lock. */
static void *cycler(void *arg) {
    struct cycler *c = arg;
    for (long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        fallow_allocator *a = c->all[i % c->n];
        unsigned char *p;
        if (fallow_alloc(a, 64 * KiB, 0, 0, (void **)&p)) { c->rc = __LINE__; break; }
        p[0] = 1;
        if (fallow_free(a, p)) { c->rc = __LINE__; break; }
        atomic_fetch_add_explicit(&c->rounds, 1, memory_order_relaxed);
    }
    return NULL;
}

static int test_fork_with_many_allocators(void) {
    /* Each thread keeps to a share of the allocators, so that the last ones are in use at every
     * fork whatever the handlers do with the first (a thread going through all of them would
     * wait at the first one the handlers hold). */
    enum { N = 600, THREADS = 3, FORKS = 30 };
    /* Workers off: 600 allocators without 1200 threads. */
    setenv("FALLOW_REPORT", "off", 1);
    setenv("FALLOW_ZEROING", "off", 1);
    fallow_allocator **all = calloc(N, sizeof *all);
    CHECK(all != NULL, "test's own array");
    for (int i = 0; i < N; i++) {
        all[i] = make(8, 9, i % 2, 1, 0);
        CHECK(all[i], "allocator %d of %d", i, N);
    }
    unsetenv("FALLOW_REPORT");
    unsetenv("FALLOW_ZEROING");
    atomic_store(&stop, 0);
    struct cycler cy[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        cy[i] = (struct cycler){ .all = all + i * (N / THREADS), .n = N / THREADS };
        CHECK(pthread_create(&t[i], NULL, cycler, &cy[i]) == 0, "thread");
    }
    int bad = 0, f;
    for (f = 0; f < FORKS && !bad; f++) {
        struct cycler *c = &cy[THREADS - 1];
        long seen = atomic_load(&c->rounds);
        while (atomic_load(&c->rounds) < seen + 50 && !c->rc) sched_yield();
        pid_t pid = fork();
        if (pid == 0) {
            alarm(CHILD_ALARM_S);
            for (int i = 0; i < N; i++) {
                int r = use(all[i], i % 2, 64 * KiB);
                if (r) _exit(r);
            }
            _exit(0);
        }
        CHECK(pid > 0, "fork: %s", strerror(errno));
        bad += reap(pid, f);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(cy[i].rc == 0, "cycler %d failed at line %d", i, cy[i].rc);
    }
    CHECK(bad == 0, "a child of fork %d failed", f - 1);
    for (int i = 0; i < N; i++) fallow_destroy(all[i]);
    free(all);
    printf("  %d forks with %d allocators alive, %d threads using them\n", f, N, THREADS);
    return 0;
}

int main(void) {
    static const struct capi_test tests[] = {
        { "fork_while_threads_allocate", test_fork_while_threads_allocate },
        { "fork_while_creating_and_destroying", test_fork_while_creating_and_destroying },
        { "fork_with_many_allocators", test_fork_with_many_allocators },
    };
    return RUN_TESTS(tests);
}

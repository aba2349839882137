/* Small objects through libfallow_preload.so with FALLOW_SMALL=1, run by scripts/test-small.sh:
 *   small_test [name...]     (no name: every test but the aborting ones)
 *   small_test abort KIND    (KIND: double, remote_double, interior, never; aborts, for the script's children)
 * Each test prints "ok <name>" or "FAIL <name>" after its reasons on stderr; the exit status is
 * the number of failures. Whether an object is fallow's is read from fallow_preload_stats (small
 * live objects), so the tests fail if the library is not preloaded or small objects are off. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fallow.h> /* FALLOW_SMALL_MAX only: nothing of libfallow.so is called */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB 1024UL
#define MiB (1024UL * 1024)
#define SMALL_MAX ((size_t)FALLOW_SMALL_MAX)

/* The sizes test_sizes takes: every one to 16 KiB (the class table), then every 509th, and the
 * two at the limit (every size to SMALL_MAX would write 2 GB). */
static size_t next_size(size_t n) {
    if (n < 16 * KiB) return n + 1;
    if (n + 509 < SMALL_MAX) return n + 509;
    return n < SMALL_MAX ? SMALL_MAX : n + 1;
}
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "  check failed at %s:%d: %s\n", __FILE__, __LINE__, #c); fprintf(stderr, "  " __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

/* glibc's own allocator, which the preload does not interpose: blocks fallow never saw. */
extern void *__libc_malloc(size_t);
extern void *__libc_memalign(size_t, size_t);

enum { S_IN_USE, S_LIVE, S_SKIPPED, S_MEMSET, S_DIRTY, S_ZEROED, S_REPORTED, S_MOVES, S_COPIES,
       S_SMALL_LIVE, S_SMALL_BYTES, S_SPANS, S_SPAN_BYTES, S_FREE_SOLE, S_N };
static size_t (*stats_fn)(uint64_t *, size_t);

static uint64_t stat_of(int i) {
    uint64_t v[S_N] = {0};
    if (!stats_fn) stats_fn = (size_t (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "fallow_preload_stats");
    if (!stats_fn) { fprintf(stderr, "fallow_preload_stats not found: is libfallow_preload.so preloaded?\n"); exit(100); }
    stats_fn(v, S_N);
    return v[i];
}

/* The byte at offset off of an object marked with seed. */
static unsigned char tag(uintptr_t seed, size_t off) { return (unsigned char)(seed * 131 + off * 7 + (off >> 8)); }
static void fill(unsigned char *p, size_t n, uintptr_t seed) { for (size_t i = 0; i < n; i++) p[i] = tag(seed, i); }
static size_t unfilled(const unsigned char *p, size_t n, uintptr_t seed) {
    for (size_t i = 0; i < n; i++) if (p[i] != tag(seed, i)) return i;
    return SIZE_MAX;
}

/* Before main, from a constructor: the program's first requests (the settings are parsed and the
 * allocator is created here, with dlsym's own allocations in stat_of among them). */
static uint64_t ctor_small_live;
static char *ctor_str;
__attribute__((constructor)) static void early(void) {
    void *p = malloc(24);
    ctor_str = strdup("made before main");
    free(p);
    ctor_small_live = stat_of(S_SMALL_LIVE);
}

static int test_before_main(void) {
    CHECK(ctor_str && !strcmp(ctor_str, "made before main"), "strdup in a constructor");
    CHECK(ctor_small_live >= 1, "no small object of fallow's live after the constructor's requests");
    free(ctor_str);
    return 0;
}

/* After a free of a small object, free goes straight to the owner's path (no test of whether
 * the pointer is fallow's first): the switch the preload makes once small objects are on. */
static int test_free_path(void) {
    free(malloc(40));
    CHECK(stat_of(S_FREE_SOLE) == 1, "free still tells fallow's pointers from glibc's first");
    return 0;
}

struct obj { unsigned char *p; size_t n; };
static int by_addr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const struct obj *)a)->p, y = (uintptr_t)((const struct obj *)b)->p;
    return x < y ? -1 : x > y;
}

/* Sizes from 1 to SMALL_MAX + 1 (`next_size`), in windows of 256 sizes live at once: 16-byte aligned, usable
 * for their size, fallow's (small ones counted as live small objects), disjoint, contents kept
 * until freed. */
static int test_sizes(void) {
    enum { W = 256 };
    struct obj o[W];
    /* This thread's first page block sets up its page cache, whose thread-local destructor glibc
     * registers with a `calloc` of its own: one small object more, live until the thread ends.
     * Made here, before the windows count theirs (spans do not go through the page caches). */
    free(malloc(SMALL_MAX + 1));
    for (size_t n = 1; n <= SMALL_MAX + 1;) {
        size_t base = n;
        int k = 0;
        uint64_t live0 = stat_of(S_SMALL_LIVE);
        int small = 0;
        for (; k < W && n <= SMALL_MAX + 1; n = next_size(n), k++) {
            o[k].n = n;
            o[k].p = malloc(n);
            CHECK(o[k].p, "malloc(%zu)", n);
            CHECK((uintptr_t)o[k].p % 16 == 0, "malloc(%zu) = %p not 16-aligned", n, (void *)o[k].p);
            CHECK(malloc_usable_size(o[k].p) >= n, "malloc(%zu): usable %zu", n, malloc_usable_size(o[k].p));
            fill(o[k].p, n, n);
            small += n <= SMALL_MAX;
        }
        CHECK(stat_of(S_SMALL_LIVE) == live0 + small, "sizes %zu..: %d small objects, live small objects %lu -> %lu",
              base, small, (unsigned long)live0, (unsigned long)stat_of(S_SMALL_LIVE));
        qsort(o, k, sizeof *o, by_addr);
        for (int i = 0; i + 1 < k; i++)
            CHECK((uintptr_t)o[i].p + malloc_usable_size(o[i].p) <= (uintptr_t)o[i + 1].p,
                  "objects of %zu and %zu bytes overlap", o[i].n, o[i + 1].n);
        for (int i = 0; i < k; i++) {
            size_t at = unfilled(o[i].p, o[i].n, o[i].n);
            CHECK(at == SIZE_MAX, "object of %zu bytes lost byte %zu", o[i].n, at);
            free(o[i].p);
        }
        CHECK(stat_of(S_SMALL_LIVE) == live0, "sizes %zu..: live small objects %lu after freeing, %lu before",
              base, (unsigned long)stat_of(S_SMALL_LIVE), (unsigned long)live0);
    }
    /* malloc(0): a unique object, freed like any other. */
    void *z = malloc(0), *z2 = malloc(0);
    CHECK(z && z2 && z != z2, "malloc(0)");
    free(z); free(z2);
    return 0;
}

/* calloc reads zero, also over objects just freed dirty, at every size class edge region. */
static int test_calloc(void) {
    enum { N = 64 };
    unsigned char *p[N];
    for (size_t n = 1; n <= SMALL_MAX + 1; n = n < 512 ? n + 7 : n * 9 / 8) {
        for (int i = 0; i < N; i++) { p[i] = malloc(n); CHECK(p[i], "malloc(%zu)", n); memset(p[i], 0xA5, malloc_usable_size(p[i])); }
        for (int i = 0; i < N; i++) free(p[i]);
        for (int i = 0; i < N; i++) {
            p[i] = calloc(1, n);
            CHECK(p[i], "calloc(1, %zu)", n);
            for (size_t j = 0; j < n; j++) CHECK(p[i][j] == 0, "calloc(1, %zu): byte %zu is %#x", n, j, p[i][j]);
            memset(p[i], 0x5A, n);
        }
        for (int i = 0; i < N; i++) free(p[i]);
    }
    void *a = calloc(0, 8), *b = calloc(8, 0);
    CHECK(a && b, "calloc with a zero count or size");
    free(a); free(b);
    errno = 0;
    CHECK(calloc(SIZE_MAX / 2, 3) == NULL && errno == ENOMEM, "calloc overflow");
    errno = 0;
    CHECK(calloc(SIZE_MAX / 2 + 2, 2) == NULL && errno == ENOMEM, "calloc overflow wrapping to a small size");
    return 0;
}

/* realloc: in place within the object's class, growing and shrinking across 16 KiB, SMALL_MAX and
 * 256 KiB, contents kept; reallocarray. */
static int test_realloc(void) {
    unsigned char *p = malloc(100);
    CHECK(p, "malloc(100)");
    size_t u = malloc_usable_size(p);
    CHECK(u >= 100 && u <= 128, "usable size of 100 bytes: %zu", u);
    fill(p, 100, 9);
    CHECK(realloc(p, u) == p, "realloc to the usable size moved the object");
    CHECK(realloc(p, u / 2 + 1) == p, "realloc to just over half the object moved it");
    CHECK(unfilled(p, u / 2 + 1 < 100 ? u / 2 + 1 : 100, 9) == SIZE_MAX, "contents after in-place realloc");
    size_t steps[] = { 1, 17, 200, 4096, 12000, SMALL_MAX, SMALL_MAX + 1, 100 * KiB, 256 * KiB - 1, 256 * KiB,
                       3 * MiB, 256 * KiB, 256 * KiB - 1, SMALL_MAX + 1, SMALL_MAX, 5000, 33, 1 };
    size_t have = u / 2 + 1 < 100 ? u / 2 + 1 : 100;
    int was_small = 1;
    fill(p, have, 10);
    for (unsigned i = 0; i < sizeof steps / sizeof *steps; i++) {
        size_t n = steps[i], keep = have < n ? have : n;
        uint64_t small0 = stat_of(S_SMALL_LIVE);
        unsigned char *q = realloc(p, n);
        CHECK(q, "realloc to %zu", n);
        size_t at = unfilled(q, keep, 10 + i);
        CHECK(at == SIZE_MAX, "realloc %zu -> %zu: byte %zu lost", have, n, at);
        CHECK(malloc_usable_size(q) >= n, "realloc to %zu: usable %zu", n, malloc_usable_size(q));
        /* Small objects stay fallow's small objects; above SMALL_MAX they are page blocks. From a
         * quarter of SMALL_MAX up (but no less than the smallest hot block, 64 KiB), the page
         * block this thread freed last may serve a request instead (the hot block). */
        int is_small = n <= SMALL_MAX;
        if (n >= SMALL_MAX / 4 && n <= SMALL_MAX && stat_of(S_SMALL_LIVE) == small0 - was_small)
            is_small = 0;
        CHECK(stat_of(S_SMALL_LIVE) == small0 - was_small + is_small, "realloc %zu -> %zu: small objects %lu -> %lu",
              have, n, (unsigned long)small0, (unsigned long)stat_of(S_SMALL_LIVE));
        was_small = is_small;
        fill(q, n, 11 + i);
        p = q;
        have = n;
    }
    free(p);
    /* realloc(NULL, n) and realloc(p, 0). */
    p = realloc(NULL, 40);
    CHECK(p, "realloc(NULL, 40)");
    CHECK(realloc(p, 0) == NULL, "realloc(p, 0) frees");
    p = reallocarray(NULL, 10, 10);
    CHECK(p && malloc_usable_size(p) >= 100, "reallocarray(NULL, 10, 10)");
    fill(p, 100, 3);
    p = reallocarray(p, 100, 100);
    CHECK(p && unfilled(p, 100, 3) == SIZE_MAX, "reallocarray grows");
    errno = 0;
    CHECK(reallocarray(p, SIZE_MAX / 4, 8) == NULL && errno == ENOMEM, "reallocarray overflow");
    free(p);
    return 0;
}

/* posix_memalign, memalign, aligned_alloc with alignments 8 .. 64 KiB; valloc, pvalloc. */
static int test_aligned(void) {
    size_t sizes[] = { 0, 1, 24, 100, 4095, 4096, 10000, SMALL_MAX, SMALL_MAX + 1, 100 * KiB };
    for (size_t al = 8; al <= 64 * KiB; al *= 2)
        for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            size_t n = sizes[i];
            void *p[3] = {0};
            CHECK(posix_memalign(&p[0], al, n) == 0 && p[0], "posix_memalign(%zu, %zu)", al, n);
            p[1] = memalign(al, n);
            p[2] = n % al == 0 ? aligned_alloc(al, n) : memalign(al, n);
            for (int k = 0; k < 3; k++) {
                CHECK(p[k] && (uintptr_t)p[k] % al == 0, "alignment %zu, size %zu: %p", al, n, p[k]);
                CHECK(malloc_usable_size(p[k]) >= n, "alignment %zu, size %zu: usable %zu", al, n, malloc_usable_size(p[k]));
                fill(p[k], n, al + n + k);
            }
            for (int k = 0; k < 3; k++) {
                CHECK(unfilled(p[k], n, al + n + k) == SIZE_MAX, "alignment %zu, size %zu: contents", al, n);
                /* realloc of an aligned object keeps the contents (the alignment is not promised). */
                if (k == 2) { p[k] = realloc(p[k], n + 100); CHECK(p[k] && unfilled(p[k], n, al + n + k) == SIZE_MAX, "realloc of an aligned object"); }
                free(p[k]);
            }
        }
    void *q;
    CHECK(posix_memalign(&q, 24, 10) == EINVAL && posix_memalign(&q, 4, 10) == EINVAL, "posix_memalign bad alignment");
    unsigned char *v = valloc(100), *pv = pvalloc(5000);
    CHECK(v && (uintptr_t)v % 4096 == 0 && pv && (uintptr_t)pv % 4096 == 0, "valloc, pvalloc");
    CHECK(malloc_usable_size(pv) >= 8192, "pvalloc(5000): usable %zu", malloc_usable_size(pv));
    memset(v, 1, 100); memset(pv, 2, 8192);
    free(v); free(pv);
    return 0;
}

/* Blocks glibc handed out (its own __libc_* entry points, with the allocator long created):
 * free, malloc_usable_size and realloc still give them to glibc, or move them to fallow. */
static int test_glibc_pointers(void) {
    unsigned char *a = __libc_malloc(100), *b = __libc_malloc(50), *c = __libc_memalign(64, 3000), *d = __libc_malloc(40);
    CHECK(a && b && c && d, "__libc_malloc");
    CHECK(malloc_usable_size(a) >= 100 && malloc_usable_size(c) >= 3000, "usable size of glibc blocks");
    free(a);
    fill(b, 50, 5);
    uint64_t small0 = stat_of(S_SMALL_LIVE);
    b = realloc(b, 200);
    CHECK(b && unfilled(b, 50, 5) == SIZE_MAX, "realloc of a glibc block kept its contents");
    CHECK(stat_of(S_SMALL_LIVE) == small0 + 1, "a glibc block grown by realloc is not a small object of fallow's");
    fill(b, 200, 6);
    b = realloc(b, 100 * KiB);
    CHECK(b && unfilled(b, 200, 6) == SIZE_MAX, "realloc from a small object to a page block");
    free(b);
    fill(d, 40, 8);
    d = realloc(d, 20); /* a glibc block that shrinks stays glibc's */
    CHECK(d && unfilled(d, 20, 8) == SIZE_MAX, "shrinking realloc of a glibc block");
    free(d);
    free(c);
    return 0;
}

/* Requests above the largest block (1 GiB by default) stay glibc's, as with small objects off:
 * glibc maps them and unmaps them at their free. The 2 GiB are address space only (never
 * touched). */
static int test_above_largest_block(void) {
    uint64_t in_use = stat_of(S_IN_USE);
    size_t n = (size_t)2 << 30;
    char *p = malloc(n), *q = calloc(1, n), *r = NULL;
    CHECK(p && q, "malloc and calloc of 2 GiB");
    CHECK(posix_memalign((void **)&r, 4096, n) == 0 && r, "posix_memalign of 2 GiB");
    CHECK(stat_of(S_IN_USE) == in_use, "a request above the largest block was served by fallow");
    CHECK(q[0] == 0 && q[n - 1] == 0, "calloc of 2 GiB reads zero");
    free(p);
    free(q);
    free(r);
    return 0;
}

/* Threads allocate and free each other's objects through a shared table of slots. */
enum { SLOTS = 1024, THREADS = 8, ROUNDS = 60000 };
static _Atomic(uintptr_t) slots[SLOTS];
static atomic_int cross_failed;
/* An object's first word holds its size; the rest is tagged by its address. */
static void *cross_worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = 8 + rand_r(&seed) % (rand_r(&seed) % 8 == 0 ? 20000 : 600);
        unsigned char *p = rand_r(&seed) % 5 ? malloc(n) : calloc(1, n);
        if (!p) { atomic_store(&cross_failed, 1); break; }
        memcpy(p, &n, sizeof n);
        for (size_t i = sizeof n; i < n && i < 64; i++) p[i] = tag((uintptr_t)p, i);
        uintptr_t old = atomic_exchange(&slots[rand_r(&seed) % SLOTS], (uintptr_t)p);
        if (old) {
            unsigned char *o = (unsigned char *)old;
            size_t m;
            memcpy(&m, o, sizeof m);
            for (size_t i = sizeof m; i < m && i < 64; i++)
                if (o[i] != tag(old, i)) { fprintf(stderr, "  object %p of %zu bytes: byte %zu changed\n", (void *)o, m, i); atomic_store(&cross_failed, 1); break; }
            if (malloc_usable_size(o) < m) atomic_store(&cross_failed, 1);
            if (rand_r(&seed) % 4 == 0) { o = realloc(o, m + 50); if (!o) atomic_store(&cross_failed, 1); }
            free(o);
        }
    }
    return NULL;
}

static int test_threads_cross(void) {
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, cross_worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    CHECK(!atomic_load(&cross_failed), "a thread found a broken object");
    for (int i = 0; i < SLOTS; i++) { free((void *)atomic_load(&slots[i])); atomic_store(&slots[i], 0); }
    return 0;
}

/* Thread exit: a thread's objects outlive it and are freed by another thread (and reallocated);
 * a thread that mallocs in a pthread key destructor, after its heap was given up, is served. */
enum { HANDED = 2000 };
static pthread_key_t late_key;
static atomic_int late_ok;
static void late_destructor(void *v) {
    /* Runs after the thread's C++/Rust thread_local destructors (glibc's order), its slab heap gone. */
    unsigned char *p[64];
    for (int i = 0; i < 64; i++) { p[i] = malloc(16 + i * 40); if (!p[i]) return; fill(p[i], 16 + i * 40, i); }
    for (int i = 0; i < 64; i++) { if (unfilled(p[i], 16 + i * 40, i) != SIZE_MAX) return; free(p[i]); }
    /* Page blocks too, past the thread's page cache's destructor. */
    unsigned char *b = malloc(100 * KiB), *c = calloc(1, MiB);
    if (!b || !c || c[MiB - 1]) return;
    fill(b, 100 * KiB, 1);
    b = realloc(b, 20);
    if (!b || unfilled(b, 20, 1) != SIZE_MAX) return;
    free(b); free(c);
    free(v);
    atomic_fetch_add(&late_ok, 1);
}
static void *exiting_thread(void *arg) {
    unsigned char **out = arg;
    for (int i = 0; i < HANDED; i++) { size_t n = 1 + i * 7 % 3000; out[i] = malloc(n); if (out[i]) fill(out[i], n, i); }
    pthread_setspecific(late_key, malloc(32));
    return NULL;
}
static void *freer(void *arg) {
    unsigned char *(*objs)[HANDED] = arg;
    for (int round = 0; round < 8; round += 2)
        for (int i = 0; i < HANDED; i++) { free(objs[round][i]); objs[round][i] = NULL; }
    return NULL;
}
static int test_thread_exit(void) {
    static unsigned char *objs[8][HANDED];
    pthread_key_create(&late_key, late_destructor);
    for (int round = 0; round < 8; round++) {
        pthread_t t;
        pthread_create(&t, NULL, exiting_thread, objs[round]);
        pthread_join(t, NULL);
    }
    CHECK(atomic_load(&late_ok) == 8, "%d of 8 key destructors were served", atomic_load(&late_ok));
    /* Checked by this thread, half of them freed here. */
    for (int round = 0; round < 8; round++)
        for (int i = 0; i < HANDED; i++) {
            size_t n = 1 + i * 7 % 3000;
            CHECK(objs[round][i] && unfilled(objs[round][i], n, i) == SIZE_MAX, "object %d of dead thread %d", i, round);
            if (round % 2) { free(objs[round][i]); objs[round][i] = NULL; }
        }
    /* A new thread (which may adopt a dead thread's heap) frees the rest. */
    pthread_t t;
    pthread_create(&t, NULL, freer, objs);
    pthread_join(t, NULL);
    return 0;
}

/* fork in a threaded program: threads keep allocating and freeing small objects (their own and
 * each other's) while the main thread forks; each child allocates, frees and starts a thread. */
static atomic_int stop_churn;
static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!atomic_load(&stop_churn)) {
        size_t n = 1 + rand_r(&seed) % 3000;
        void *p = malloc(n);
        if (p) memset(p, 1, n);
        uintptr_t old = atomic_exchange(&slots[rand_r(&seed) % SLOTS], (uintptr_t)p);
        free((void *)old);
    }
    return NULL;
}
static void *child_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 10000; i++) { void *p = malloc(1 + i % 2000); if (!p) return (void *)1; free(p); }
    return NULL;
}
static int test_fork(void) {
    enum { C = 4 };
    int FORKS = getenv("SMALL_TEST_FORKS") ? atoi(getenv("SMALL_TEST_FORKS")) : 200;
    pthread_t th[C];
    atomic_store(&stop_churn, 0);
    for (int i = 0; i < C; i++) pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(100 + i));
    int bad = 0;
    for (int f = 0; f < FORKS && !bad; f++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20); /* a deadlock in the child shows as SIGALRM */
            void *keep[500];
            for (int i = 0; i < 500; i++) { keep[i] = malloc(1 + i * 13); if (!keep[i]) _exit(2); memset(keep[i], 3, 1 + i * 13); }
            /* The parent's objects, still live in the child's copy, freed here. */
            for (int i = 0; i < SLOTS; i += 7) { free((void *)atomic_load(&slots[i])); atomic_store(&slots[i], 0); }
            pthread_t t;
            void *r = (void *)1;
            if (pthread_create(&t, NULL, child_thread, NULL) || pthread_join(t, &r) || r) _exit(3);
            for (int i = 0; i < 500; i++) free(keep[i]);
            _exit(0);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "  fork %d: child status %#x%s\n", f, st, WIFSIGNALED(st) ? " (signal)" : "");
            bad = 1;
        }
    }
    atomic_store(&stop_churn, 1);
    for (int i = 0; i < C; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < SLOTS; i++) { free((void *)atomic_load(&slots[i])); atomic_store(&slots[i], 0); }
    CHECK(!bad, "a child of fork failed");
    return 0;
}

/* The frees of `small_test abort remote_double`: another thread frees the object twice. */
static void *free_twice(void *p) {
    free(p);
    free(p);
    return NULL;
}

/* `small_test abort KIND`: the bad free the script expects to abort with fallow's message. */
static int bad_free(const char *kind) {
    unsigned char *p = malloc(64), *q = malloc(64);
    if (!p || !q) return 2;
    if (!strcmp(kind, "double")) { free(p); free(p); }
    else if (!strcmp(kind, "interior")) free(p + 16);
    else if (!strcmp(kind, "never")) {
        /* An address in the span never handed out: far past the two objects in a fresh class. */
        unsigned char *r = malloc(3000);
        free(r + 3072 * 8);
    } else if (!strcmp(kind, "realloc_interior")) { void *r = realloc(p + 32, 100); (void)r; }
    else if (!strcmp(kind, "remote_double")) {
        pthread_t t;
        if (pthread_create(&t, NULL, free_twice, p)) return 2;
        pthread_join(t, NULL);
    }
    else return 2;
    return 0; /* not reached if fallow caught it */
}

struct test { const char *name; int (*fn)(void); };
static const struct test tests[] = {
    { "before_main", test_before_main },
    { "free_path", test_free_path },
    { "sizes", test_sizes },
    { "calloc", test_calloc },
    { "realloc", test_realloc },
    { "aligned", test_aligned },
    { "glibc_pointers", test_glibc_pointers },
    { "above_largest_block", test_above_largest_block },
    { "threads_cross", test_threads_cross },
    { "thread_exit", test_thread_exit },
    { "fork", test_fork },
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "abort")) return bad_free(argv[2]);
    int failures = 0;
    for (unsigned i = 0; i < sizeof tests / sizeof *tests; i++) {
        int wanted = argc == 1;
        for (int a = 1; a < argc; a++) wanted |= !strcmp(argv[a], tests[i].name);
        if (!wanted) continue;
        int r = tests[i].fn();
        printf("%s %s\n", r ? "FAIL" : "ok", tests[i].name);
        failures += r != 0;
    }
    return failures;
}

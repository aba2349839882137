/* Test of the C API with small objects on (FALLOW_CREATE_SMALL_OBJECTS, FALLOW_SMALL=1): the
 * allocation functions serve requests of up to FALLOW_SMALL_MAX as objects of the slab layer, calloc-like
 * with FALLOW_ZERO, measured, resized and freed, bad frees are error codes, and struct
 * fallow_stats carries the small objects' figures. Built against libfallow.so and libfallow.a by
 * scripts/test-capi.sh. Prints "ok <name>" per test; exit status = number of failures. */
#define _GNU_SOURCE
#include <errno.h>
#include <fallow.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "capi_check.h"

#define KiB 1024UL
#define MiB (1024UL * 1024)
#define SMALL_MAX ((size_t)FALLOW_SMALL_MAX)
/* Past the class table (the hot path's): every size to here, a stride of sizes above. */
#define TABLE_MAX (16 * KiB)

/* The sizes the sizes test takes: every one to TABLE_MAX, then every 613th, and SMALL_MAX + 1
 * (all of them would pass the arena). */
static int tested(size_t n) { return n <= TABLE_MAX || (n - TABLE_MAX) % 613 == 0 || n == SMALL_MAX || n == SMALL_MAX + 1; }

/* A small allocator: 256 MiB arena, workers off (nothing moves behind the test's back). */
static int make(unsigned options, fallow_allocator **a) {
    fallow_config c;
    fallow_config_init(&c);
    c.arena_size = 256 * MiB;
    c.max_order = 14;
    int rc = fallow_create_with_options(&c, NULL, options, a);
    if (rc == 0) {
        fallow_set_tunable(*a, "zeroing", 0);
        fallow_set_tunable(*a, "report", 0);
    }
    return rc;
}

/* The size class the slab layer gives a request of n bytes (at most SMALL_MAX): 16-byte steps to
 * 128, then four classes per doubling to 16 KiB, eight to 64 KiB. */
static size_t class_of(size_t n) {
    if (n <= 128) return (n + 15) & ~(size_t)15;
    size_t p = 128;
    while (p * 2 < n) p *= 2;
    size_t step = p >= 16 * KiB ? p / 8 : p / 4;
    return (n + step - 1) / step * step;
}

static int test_options(void) {
    fallow_allocator *a = NULL;
    void *p;
    CHECK(fallow_create_with_options(NULL, NULL, 4, &a) == EINVAL && strstr(fallow_last_error(), "option"), "unknown bit");
    CHECK(fallow_create_with_options(NULL, NULL, 0, NULL) == EINVAL, "out NULL");
    /* Off by default: a page block. */
    CHECK(make(0, &a) == 0, "create");
    CHECK(fallow_alloc(a, 100, 0, 0, &p) == 0 && fallow_usable_size(a, p) == 4096, "page block: %zu", fallow_usable_size(a, p));
    CHECK(fallow_free(a, p) == 0, "free");
    fallow_destroy(a);
    /* On: the class of 100 bytes, 112. */
    CHECK(make(FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create small");
    CHECK(fallow_alloc(a, 100, 0, 0, &p) == 0 && fallow_usable_size(a, p) == 112, "small object: %zu", fallow_usable_size(a, p));
    CHECK(fallow_free(a, p) == 0, "free small");
    fallow_destroy(a);
    /* FALLOW_SMALL from the environment decides over the option, either way. */
    setenv("FALLOW_SMALL", "1", 1);
    CHECK(make(FALLOW_CREATE_FROM_ENV, &a) == 0, "create from env");
    CHECK(fallow_alloc(a, 100, 0, 0, &p) == 0 && fallow_usable_size(a, p) == 112, "FALLOW_SMALL=1: %zu", fallow_usable_size(a, p));
    CHECK(fallow_free(a, p) == 0, "free");
    fallow_destroy(a);
    setenv("FALLOW_SMALL", "0", 1);
    CHECK(make(FALLOW_CREATE_FROM_ENV | FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create from env");
    CHECK(fallow_alloc(a, 100, 0, 0, &p) == 0 && fallow_usable_size(a, p) == 4096, "FALLOW_SMALL=0: %zu", fallow_usable_size(a, p));
    CHECK(fallow_free(a, p) == 0, "free");
    fallow_destroy(a);
    unsetenv("FALLOW_SMALL");
    return 0;
}

/* Sizes from 1 to SMALL_MAX + 1 (`tested`): its class, 16-byte aligned, apart from the others, contents
 * kept; the statistics count them (the full struct) and not past an older struct's size. */
static int test_sizes_and_stats(void) {
    fallow_allocator *a;
    CHECK(make(FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create");
    enum { N = SMALL_MAX + 1 };
    unsigned char **p = calloc(N + 1, sizeof *p);
    CHECK(p != NULL, "test's own array");
    uint64_t live = 0, live_bytes = 0;
    for (size_t n = 1; n <= N; n++) {
        if (!tested(n)) continue;
        CHECK(fallow_alloc(a, n, 0, 0, (void **)&p[n]) == 0, "alloc(%zu)", n);
        size_t u = fallow_usable_size(a, p[n]);
        if (n <= SMALL_MAX) {
            CHECK(u == class_of(n) && (uintptr_t)p[n] % 16 == 0, "%zu bytes: usable %zu at %p, class %zu", n, u, (void *)p[n], class_of(n));
            live++;
            live_bytes += u;
        } else {
            CHECK(u == SMALL_MAX + 4 * KiB && (uintptr_t)p[n] % 4096 == 0, "SMALL_MAX + 1 is a page block: usable %zu", u);
        }
        memset(p[n], (int)(n & 0xff), n);
    }
    for (size_t n = 1; n <= N; n += 97) if (tested(n)) CHECK(p[n][0] == (n & 0xff) && p[n][n - 1] == (n & 0xff), "contents of %zu", n);
    fallow_stats s, old;
    CHECK(fallow_stats_read_size(a, &s, sizeof s) == 0, "stats");
    CHECK(s.small_live_objects == live && s.small_live_bytes == live_bytes, "live %lu objects, %lu bytes; %lu, %lu handed out",
          (unsigned long)s.small_live_objects, (unsigned long)s.small_live_bytes, (unsigned long)live, (unsigned long)live_bytes);
    CHECK(s.small_spans > 0 && s.small_span_bytes >= live_bytes && s.small_free_bytes == s.small_span_bytes - live_bytes,
          "%lu spans of %lu bytes, %lu free", (unsigned long)s.small_spans, (unsigned long)s.small_span_bytes, (unsigned long)s.small_free_bytes);
    CHECK(s.bytes_in_use >= s.small_span_bytes + SMALL_MAX + 4 * KiB, "spans are live blocks: %lu in use", (unsigned long)s.bytes_in_use);
    /* The struct as it was before the small objects' figures: filled up to them, not past. */
    memset(&old, 0xab, sizeof old);
    CHECK(fallow_stats_read_size(a, &old, offsetof(fallow_stats, small_live_objects)) == 0, "older size");
    CHECK(old.pressure_signal <= 4 && old.live_blocks == s.live_blocks, "older struct filled (live blocks %lu)", (unsigned long)old.live_blocks);
    CHECK(old.small_live_objects == 0xababababababababull && old.small_free_bytes == 0xababababababababull, "written past the older struct");
    memset(&old, 0xab, sizeof old);
    CHECK(fallow_stats_read(a, &old) == 0 && old.memory_limit_bytes == 0xababababababababull && old.small_spans == 0xababababababababull,
          "fallow_stats_read wrote past the first struct");
    for (size_t n = 1; n <= N; n++) if (tested(n)) CHECK(fallow_free(a, p[n]) == 0, "free of %zu", n);
    CHECK(fallow_stats_read_size(a, &s, sizeof s) == 0 && s.small_live_objects == 0 && s.small_live_bytes == 0, "nothing live: %lu",
          (unsigned long)s.small_live_objects);
    free(p);
    fallow_destroy(a);
    return 0;
}

/* FALLOW_ZERO over objects just freed dirty reads zero over the whole class; alignments. */
static int test_zero_and_align(void) {
    fallow_allocator *a;
    CHECK(make(FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create");
    static const size_t sizes[] = { 1, 24, 100, 200, 1000, 3000, 4096, 10000, SMALL_MAX };
    enum { K = 64 };
    int reused = 0;
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *d[K], *z[K];
        for (int k = 0; k < K; k++) {
            CHECK(fallow_alloc(a, n, 0, 0, (void **)&d[k]) == 0, "alloc %zu", n);
            memset(d[k], 0xA5, fallow_usable_size(a, d[k]));
        }
        for (int k = 0; k < K; k++) CHECK(fallow_free(a, d[k]) == 0, "free");
        for (int k = 0; k < K; k++) {
            CHECK(fallow_alloc(a, n, 0, FALLOW_ZERO, (void **)&z[k]) == 0, "zero alloc %zu", n);
            size_t u = fallow_usable_size(a, z[k]);
            CHECK(u == class_of(n), "class of %zu: %zu", n, u);
            for (size_t b = 0; b < u; b++) CHECK(z[k][b] == 0, "FALLOW_ZERO object of %zu: byte %zu is %#x", n, b, z[k][b]);
            for (int j = 0; j < K; j++) reused += z[k] == d[j];
        }
        for (int k = 0; k < K; k++) CHECK(fallow_free(a, z[k]) == 0, "free");
    }
    CHECK(reused > 0, "no FALLOW_ZERO object reused one just freed dirty: the memset went untested");
    /* Alignments: to align and the size (a power-of-two class), up to 16 KiB; a page block above. */
    static const size_t aligns[] = { 16, 32, 64, 256, 4096, 16384, 65536, 262144, 524288 };
    for (unsigned i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        void *p;
        CHECK(fallow_alloc(a, 100, aligns[i], 0, &p) == 0 && (uintptr_t)p % aligns[i] == 0, "100 bytes aligned to %zu: %p", aligns[i], p);
        size_t u = fallow_usable_size(a, p), want = aligns[i] <= 16 ? 112 : aligns[i] <= 128 ? 128 : aligns[i] <= TABLE_MAX ? aligns[i] : 4096;
        CHECK(u == want, "100 bytes aligned to %zu: usable %zu, %zu expected", aligns[i], u, want);
        CHECK(fallow_free(a, p) == 0, "free aligned");
    }
    void *p;
    CHECK(fallow_alloc(a, 100, 3, 0, &p) == EINVAL && strstr(fallow_last_error(), "alignment"), "bad alignment");
    CHECK(fallow_alloc(a, 0, 0, 0, &p) == EINVAL && strstr(fallow_last_error(), "zero"), "zero size");
    /* POPULATE and LOCK are page-block requests. */
    CHECK(fallow_alloc(a, 100, 0, FALLOW_POPULATE, &p) == 0 && fallow_usable_size(a, p) == 4096, "POPULATE: %zu", fallow_usable_size(a, p));
    CHECK(fallow_free(a, p) == 0, "free");
    fallow_destroy(a);
    return 0;
}

/* Bad frees are error codes, found before anything changes; resize in place and free_sized. */
static int test_bad_frees_and_resize(void) {
    fallow_allocator *a;
    CHECK(make(FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create");
    unsigned char *p, *q;
    CHECK(fallow_alloc(a, 100, 0, 0, (void **)&p) == 0 && fallow_alloc(a, 100, 0, 0, (void **)&q) == 0, "alloc");
    char want[128];
    snprintf(want, sizeof want, "%p", (void *)p);
    CHECK(fallow_free(a, p + 16) == EINVAL && strstr(fallow_last_error(), want), "inside an object: %s", fallow_last_error());
    CHECK(fallow_free(a, q + 112 * 400) == EINVAL && strstr(fallow_last_error(), "invalid"), "never handed out: %s", fallow_last_error());
    CHECK(fallow_free(a, p) == 0, "free");
    CHECK(fallow_free(a, p) == EINVAL && errno == EINVAL && strstr(fallow_last_error(), "double free"), "double free: %s", fallow_last_error());
    fallow_stats s;
    CHECK(fallow_stats_read_size(a, &s, sizeof s) == 0 && s.small_live_objects == 1, "one live: %lu", (unsigned long)s.small_live_objects);
    /* Resize in place: within the class only. */
    int done = -1;
    CHECK(fallow_resize_in_place(a, q, 112, &done) == 0 && done == 1, "grow within the class");
    CHECK(fallow_resize_in_place(a, q, 8, &done) == 0 && done == 1, "shrink");
    CHECK(fallow_resize_in_place(a, q, 113, &done) == 0 && done == 0, "past the class: the caller moves it");
    CHECK(fallow_resize_in_place(a, q, 0, &done) == EINVAL, "to zero bytes");
    CHECK(fallow_resize_in_place(a, q + 16, 50, &done) == EINVAL, "inside an object");
    CHECK(fallow_usable_size(a, q) == 112, "unchanged");
    /* free_sized: any size the class could have served. */
    CHECK(fallow_free_sized(a, q, 113) == EINVAL && strstr(fallow_last_error(), "size mismatch"), "above the class: %s", fallow_last_error());
    CHECK(fallow_free_sized(a, q, 0) == EINVAL, "zero");
    CHECK(fallow_free_sized(a, q, 100) == 0, "free_sized");
    CHECK(fallow_stats_read_size(a, &s, sizeof s) == 0 && s.small_live_objects == 0, "none live: %lu", (unsigned long)s.small_live_objects);
    /* Page blocks keep their rules beside small objects. */
    void *b;
    CHECK(fallow_alloc(a, 400 * KiB, 0, 0, &b) == 0 && fallow_usable_size(a, b) == 400 * KiB, "page block");
    CHECK(fallow_resize_in_place(a, b, 300 * KiB, &done) == 0 && done == 1 && fallow_usable_size(a, b) == 300 * KiB, "page shrink");
    CHECK(fallow_free_sized(a, b, 400 * KiB) == EINVAL, "page size mismatch");
    CHECK(fallow_free(a, b) == 0 && fallow_free(a, b) == EINVAL, "page free, double free");
    fallow_destroy(a);
    return 0;
}

/* Objects made by one thread and freed by another (remote frees), and the other way round. */
struct batch { fallow_allocator *a; unsigned char *p[1000]; int rc; };

static void *free_batch(void *arg) {
    struct batch *b = arg;
    b->rc = 0;
    for (int i = 0; i < 1000; i++) {
        if (b->p[i][0] != (unsigned char)i || fallow_free(b->a, b->p[i]) != 0) b->rc = 1;
    }
    for (int i = 0; i < 1000; i++) {
        size_t n = 1 + i * 7 % 2000;
        if (fallow_alloc(b->a, n, 0, 0, (void **)&b->p[i]) != 0 || fallow_usable_size(b->a, b->p[i]) != class_of(n)) b->rc = 1;
        else b->p[i][0] = (unsigned char)i;
    }
    return NULL;
}

static int test_threads(void) {
    fallow_allocator *a;
    CHECK(make(FALLOW_CREATE_SMALL_OBJECTS, &a) == 0, "create");
    struct batch b = { .a = a };
    for (int i = 0; i < 1000; i++) {
        size_t n = 1 + i * 13 % 3000;
        CHECK(fallow_alloc(a, n, 0, 0, (void **)&b.p[i]) == 0 && fallow_usable_size(a, b.p[i]) == class_of(n), "alloc of %zu", n);
        b.p[i][0] = (unsigned char)i;
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_batch, &b) == 0 && pthread_join(t, NULL) == 0 && b.rc == 0, "other thread");
    /* The other thread has exited: its objects are in an abandoned heap, freed from here. */
    for (int i = 0; i < 1000; i++) CHECK(b.p[i][0] == (unsigned char)i && fallow_free(a, b.p[i]) == 0, "free of the other thread's %d", i);
    fallow_destroy(a);
    return 0;
}

int main(void) {
    static const struct capi_test tests[] = {
        { "small_options", test_options },
        { "small_sizes_and_stats", test_sizes_and_stats },
        { "small_zero_and_align", test_zero_and_align },
        { "small_bad_frees_and_resize", test_bad_frees_and_resize },
        { "small_threads", test_threads },
    };
    return RUN_TESTS(tests);
}

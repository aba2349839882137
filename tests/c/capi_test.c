/* Test of the C API (include/fallow.h), built against libfallow.so and libfallow.a by
 * scripts/test-capi.sh. Prints "ok <name>" per test; exit status = number of failures. */
#define _GNU_SOURCE
#include <errno.h>
#include <fallow.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "capi_check.h"

#define MiB (1024UL * 1024)

static int resident(void *p, size_t n) {
    unsigned char v[4096];
    size_t pages = n / 4096;
    if (pages > sizeof v || mincore(p, n, v)) return -1;
    int r = 0;
    for (size_t i = 0; i < pages; i++) r += v[i] & 1;
    return r;
}

static int test_config_and_create(void) {
    fallow_config c;
    fallow_config_init(&c);
    CHECK(c.max_order == 18 && c.arena_size == 0 && c.thp == 0 && c.backing == FALLOW_BACKING_ANONYMOUS, "defaults");
    fallow_allocator *a = NULL;
    c.max_order = 31;
    errno = 0;
    CHECK(fallow_create(&c, &a) == EINVAL && errno == EINVAL && a == NULL, "max_order 31 refused");
    CHECK(strstr(fallow_last_error(), "max_order") != NULL, "message names the setting: %s", fallow_last_error());
    c.max_order = 18; c.backing = 7;
    CHECK(fallow_create(&c, &a) == EINVAL && strstr(fallow_last_error(), "backing"), "bad backing");
    c.backing = FALLOW_BACKING_ANONYMOUS; c.thp = 1; c.max_order = 8;
    CHECK(fallow_create(&c, &a) == EINVAL && strstr(fallow_last_error(), "thp"), "thp needs order 9");
    CHECK(fallow_create(NULL, &a) == 0 && a, "default create");
    fallow_destroy(a);
    c.thp = 1; c.max_order = 12; c.arena_size = 64 * MiB; c.backing = FALLOW_BACKING_MEMFD;
    CHECK(fallow_create(&c, &a) == 0, "memfd + thp create");
    void *p;
    CHECK(fallow_alloc(a, 3 * MiB, 0, FALLOW_ZERO, &p) == 0 && ((unsigned char *)p)[3 * MiB - 1] == 0, "memfd alloc");
    CHECK(fallow_free(a, p) == 0, "memfd free");
    fallow_destroy(a);
    fallow_destroy(NULL);
    CHECK(strcmp(fallow_version(), "0.1.0") >= 0, "version %s", fallow_version());
    return 0;
}

static int test_alloc_flags(void) {
    fallow_config c; fallow_config_init(&c);
    c.arena_size = 256 * MiB; c.max_order = 14; /* 64 MiB blocks */
    fallow_allocator *a;
    CHECK(fallow_create(&c, &a) == 0, "create");
    void *p = NULL;
    /* Plain, aligned. */
    CHECK(fallow_alloc(a, 100000, 65536, 0, &p) == 0 && (uintptr_t)p % 65536 == 0, "aligned alloc");
    CHECK(fallow_owns(a, p) && !fallow_owns(a, &c), "owns");
    CHECK(fallow_usable_size(a, p) == 102400, "usable size %zu", fallow_usable_size(a, p));
    memset(p, 0xEE, 100000);
    CHECK(fallow_free(a, p) == 0, "free");
    /* ZERO over recycled dirty pages reads zero and is counted as memset. */
    fallow_stats s0, s1;
    CHECK(fallow_stats_read(a, &s0) == 0, "stats");
    CHECK(s0.free_dirty_pages >= 25, "dirty pages after free: %lu", (unsigned long)s0.free_dirty_pages);
    void *q;
    CHECK(fallow_alloc(a, 8 * MiB, 0, FALLOW_ZERO, &q) == 0, "zero alloc");
    for (size_t i = 0; i < 8 * MiB; i++) CHECK(((unsigned char *)q)[i] == 0, "byte %zu", i);
    CHECK(fallow_stats_read(a, &s1) == 0, "stats");
    CHECK(s1.zero_skipped_bytes + s1.zeroed_on_alloc_bytes - s0.zero_skipped_bytes - s0.zeroed_on_alloc_bytes == 8 * MiB,
          "zero accounting: skipped %lu memset %lu", (unsigned long)s1.zero_skipped_bytes, (unsigned long)s1.zeroed_on_alloc_bytes);
    CHECK(s1.live_blocks == 1 && s1.bytes_in_use == 8 * MiB && s1.alloc_calls == 2 && s1.free_calls == 1, "counters");
    CHECK(s1.reserved_bytes == 256 * MiB && s1.arenas == 1, "reserved %lu", (unsigned long)s1.reserved_bytes);
    uint64_t listed = 0;
    for (int k = 0; k < FALLOW_CLASSES; k++) for (int o = 0; o < FALLOW_ORDERS; o++) listed += s1.free_blocks[k][o] << o;
    CHECK(listed == s1.free_dirty_pages + s1.free_zeroed_pages + s1.free_reported_pages + s1.free_lazy_pages, "free blocks add up");
    /* POPULATE: every page resident on return. */
    void *r;
    CHECK(fallow_alloc(a, 4 * MiB, 0, FALLOW_POPULATE, &r) == 0, "populate");
    CHECK(resident(r, 4 * MiB) == 1024, "resident pages %d", resident(r, 4 * MiB));
    /* Resize in place: shrink always, grow into the free pages after it. */
    int done = -1;
    CHECK(fallow_resize_in_place(a, r, 1 * MiB, &done) == 0 && done == 1, "shrink");
    CHECK(fallow_usable_size(a, r) == 1 * MiB, "after shrink");
    CHECK(fallow_resize_in_place(a, r, 2 * MiB, &done) == 0, "grow");
    if (done) CHECK(fallow_usable_size(a, r) == 2 * MiB, "after grow");
    CHECK(fallow_free_sized(a, r, 12345) == EINVAL && strstr(fallow_last_error(), "size mismatch"), "free_sized mismatch: %s", fallow_last_error());
    CHECK(fallow_free_sized(a, r, fallow_usable_size(a, r)) == 0, "free_sized");
    /* LOCK: mlock; may be refused by RLIMIT_MEMLOCK, which must then be an error, not a crash. */
    void *l;
    int rc = fallow_alloc(a, 1 * MiB, 0, FALLOW_LOCK | FALLOW_ZERO, &l);
    if (rc == 0) {
        CHECK(fallow_stats_read(a, &s1) == 0 && s1.locked_bytes == 1 * MiB, "locked bytes %lu", (unsigned long)s1.locked_bytes);
        CHECK(resident(l, 1 * MiB) == 256, "locked block resident");
        CHECK(fallow_free(a, l) == 0, "free locked");
        CHECK(fallow_stats_read(a, &s1) == 0 && s1.locked_bytes == 0, "unlocked");
    } else {
        CHECK((rc == EPERM || rc == ENOMEM || rc == EAGAIN) && l == NULL && strstr(fallow_last_error(), "mlock"), "lock error %d", rc);
        printf("  FALLOW_LOCK refused here (%s)\n", fallow_last_error());
    }
    /* Bad requests. */
    CHECK(fallow_alloc(a, 0, 0, 0, &p) == EINVAL && errno == EINVAL, "zero size");
    CHECK(fallow_alloc(a, 4096, 3000, 0, &p) == EINVAL && strstr(fallow_last_error(), "alignment"), "bad alignment");
    CHECK(fallow_alloc(a, 4096, 0, 64, &p) == EINVAL && strstr(fallow_last_error(), "flag"), "unknown flag");
    CHECK(fallow_alloc(a, SIZE_MAX / 2, 0, 0, &p) == ENOMEM && errno == ENOMEM && p == NULL, "too large");
    CHECK(fallow_free(a, q) == 0, "free q");
    fallow_destroy(a);
    return 0;
}

static int test_bad_pointers(void) {
    fallow_allocator *a;
    CHECK(fallow_create(NULL, &a) == 0, "create");
    void *p;
    CHECK(fallow_alloc(a, 1 * MiB, 0, 0, &p) == 0, "alloc");
    char want[128];
    snprintf(want, sizeof want, "%p", (void *)((char *)p + 4096));
    CHECK(fallow_free(a, (char *)p + 4096) == EINVAL && strstr(fallow_last_error(), want), "interior pointer: %s", fallow_last_error());
    CHECK(fallow_free(a, p) == 0, "free");
    snprintf(want, sizeof want, "double free of %p", p);
    CHECK(fallow_free(a, p) == EINVAL && strstr(fallow_last_error(), want), "double free: %s", fallow_last_error());
    int x;
    CHECK(fallow_free(a, &x) == EINVAL && strstr(fallow_last_error(), "invalid pointer"), "foreign pointer");
    CHECK(fallow_usable_size(a, p) == 0, "usable size of freed block");
    CHECK(fallow_alloc(NULL, 1, 0, 0, &p) == EINVAL && strstr(fallow_last_error(), "NULL"), "NULL allocator");
    fallow_stats s;
    CHECK(fallow_stats_read(a, &s) == 0 && s.live_blocks == 0, "nothing live");
    fallow_destroy(a);
    return 0;
}

static int test_tunables(void) {
    fallow_allocator *a;
    CHECK(fallow_create(NULL, &a) == 0, "create");
    uint64_t v;
    CHECK(fallow_set_tunable(a, "no_such_thing", 1) == EINVAL && strstr(fallow_last_error(), "no_such_thing"), "unknown name");
    CHECK(fallow_get_tunable(a, "no_such_thing", &v) == EINVAL, "unknown name (get)");
    CHECK(fallow_set_tunable(a, "report_delay_ms", 500) == 0, "set: %s", fallow_last_error());
    CHECK(fallow_get_tunable(a, "report_delay_ms", &v) == 0 && v == 500, "round trip %lu", (unsigned long)v);
    CHECK(fallow_set_tunable(a, "zeroing", 0) == 0 && fallow_get_tunable(a, "zeroing", &v) == 0 && v == 0, "zeroing off");
    CHECK(fallow_set_tunable(a, "report_mode", 2) == 0 && fallow_get_tunable(a, "report_mode", &v) == 0 && v == 2, "mode free");
    CHECK(fallow_set_tunable(a, "report_batch", 100000) == EINVAL && strstr(fallow_last_error(), "report_batch"), "out of range refused");
    CHECK(fallow_set_tunable(a, "zeroing", 7) == EINVAL && strstr(fallow_last_error(), "zeroing"), "bad flag refused");
    CHECK(fallow_get_tunable(a, "memory_limit", &v) == 0 && v == FALLOW_MEMORY_LIMIT_AUTO, "memory limit auto by default");
    CHECK(fallow_set_tunable(a, "memory_limit", 64u << 20) == 0 && fallow_get_tunable(a, "memory_limit", &v) == 0 && v == 64u << 20, "memory limit set");
    CHECK(fallow_set_tunable(a, "memory_limit", 100) == EINVAL && strstr(fallow_last_error(), "memory_limit"), "limit below a page refused");
    {
        /* fallow_stats_read writes the older struct only; fallow_stats_read_size the whole. */
        fallow_stats st;
        memset(&st, 0xab, sizeof st);
        CHECK(fallow_stats_read(a, &st) == 0 && st.memory_limit_hits == 0xababababababababull, "fallow_stats_read wrote past the older struct");
        CHECK(fallow_stats_read_size(a, &st, sizeof st) == 0 && st.memory_limit_source <= 4 && st.pressure_signal <= 4, "stats read by size");
        CHECK(fallow_stats_read_size(a, &st, 8) == EINVAL && strstr(fallow_last_error(), "size"), "too small a size refused");
    }
    CHECK(fallow_set_tunable(a, "memory_limit", FALLOW_MEMORY_LIMIT_OFF) == 0 && fallow_get_tunable(a, "memory_limit", &v) == 0 && v == 0, "memory limit off");
    CHECK(fallow_set_tunable(a, "pressure", 0) == 0 && fallow_get_tunable(a, "pressure", &v) == 0 && v == 0, "pressure off");
    CHECK(fallow_set_tunable(a, "pressure", 2) == EINVAL && strstr(fallow_last_error(), "pressure"), "bad pressure flag refused");
    CHECK(fallow_set_tunable(a, "report_mode", 3) == EINVAL && strstr(fallow_last_error(), "report_mode"), "punch on anonymous memory refused");
    CHECK(fallow_get_tunable(a, "report_batch", &v) == 0 && v == 32, "refused values change nothing (%lu)", (unsigned long)v);
    fallow_destroy(a);
    return 0;
}

/* Call fallow_create_from_env with stderr captured into log (NUL-terminated); the return code. */
static int create_from_env_logged(const fallow_config *c, fallow_allocator **a, char *log, size_t len) {
    fflush(stderr);
    FILE *f = tmpfile();
    int saved = dup(2);
    if (!f || saved < 0 || dup2(fileno(f), 2) < 0) return -1;
    int rc = fallow_create_from_env(c, a);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(log, 1, len - 1, f);
    log[n] = 0;
    fclose(f);
    return rc;
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The FALLOW_* variables, as the preload reads them: same values, same warnings. */
static int test_from_env(void) {
    char log[4096];
    fallow_allocator *a = NULL;
    uint64_t v;
    fallow_config c; fallow_config_init(&c);
    c.max_order = 8; /* 1 MiB blocks; FALLOW_THP=1 raises them to 2 MiB */
    setenv("FALLOW_ARENA_SIZE", "64m", 1);
    setenv("FALLOW_THP", "1", 1);
    setenv("FALLOW_REPORT", "off", 1);
    setenv("FALLOW_REPORT_DELAY_MS", "500", 1);
    setenv("FALLOW_ZEROING", "off", 1);
    setenv("FALLOW_MEMORY_LIMIT", "512MiB", 1);
    setenv("FALLOW_PRESSURE", "off", 1);
    CHECK(create_from_env_logged(&c, &a, log, sizeof log) == 0 && a, "create from env");
    CHECK(log[0] == 0, "no warning for good values: %s", log);
    CHECK(fallow_get_tunable(a, "report", &v) == 0 && v == 0, "FALLOW_REPORT=off: report %lu", (unsigned long)v);
    CHECK(fallow_get_tunable(a, "zeroing", &v) == 0 && v == 0, "FALLOW_ZEROING=off");
    CHECK(fallow_get_tunable(a, "report_delay_ms", &v) == 0 && v == 500, "delay %lu", (unsigned long)v);
    CHECK(fallow_get_tunable(a, "memory_limit", &v) == 0 && v == 512 * MiB, "FALLOW_MEMORY_LIMIT=512MiB: %lu", (unsigned long)v);
    CHECK(fallow_get_tunable(a, "pressure", &v) == 0 && v == 0, "FALLOW_PRESSURE=off");
    fallow_stats s;
    CHECK(fallow_stats_read(a, &s) == 0 && s.reserved_bytes == 64 * MiB, "arena %lu", (unsigned long)s.reserved_bytes);
    void *p;
    CHECK(fallow_alloc(a, 2 * MiB, 2 * MiB, 0, &p) == 0, "a 2 MiB block (FALLOW_THP=1 raised max_order to 9)");
    CHECK(fallow_free(a, p) == 0, "free");
    fallow_destroy(a);
    /* Bad values: one warning each, naming the value used, and the allocator is created. */
    setenv("FALLOW_ZEROING", "busy", 1);
    setenv("FALLOW_ARENA_SIZE", "3m", 1);
    setenv("FALLOW_THRESHOLD", "lots", 1);
    setenv("FALLOW_MEMORY_LIMIT", "plenty", 1);
    unsetenv("FALLOW_PRESSURE");
    a = NULL;
    CHECK(create_from_env_logged(&c, &a, log, sizeof log) == 0 && a, "create despite bad values");
    fputs(log, stdout);
    CHECK(lines(log) == 4, "four warnings: %s", log);
    CHECK(strstr(log, "FALLOW_MEMORY_LIMIT=\"plenty\" is not auto, off or a size") && strstr(log, "using the default auto\n"),
          "memory limit: %s", log);
    CHECK(fallow_get_tunable(a, "memory_limit", &v) == 0 && v == FALLOW_MEMORY_LIMIT_AUTO, "the default limit applies");
    CHECK(strstr(log, "fallow: warning: FALLOW_ZEROING=\"busy\" is not one of idle, off; using the default idle\n"),
          "zeroing: %s", log);
    CHECK(strstr(log, "FALLOW_ARENA_SIZE=\"3m\" is not a multiple of the largest block (2097152 bytes); using 4194304\n"),
          "arena: %s", log);
    CHECK(strstr(log, "FALLOW_THRESHOLD=\"lots\"") && strstr(log, "default 262144"), "threshold: %s", log);
    CHECK(fallow_get_tunable(a, "zeroing", &v) == 0 && v == 1, "the default applies");
    CHECK(fallow_stats_read(a, &s) == 0 && s.reserved_bytes == 4 * MiB, "arena %lu", (unsigned long)s.reserved_bytes);
    fallow_destroy(a);
    /* The caller's checks stay: a bad config is EINVAL before the environment is read. */
    c.backing = 9;
    CHECK(create_from_env_logged(&c, &a, log, sizeof log) == EINVAL && strstr(fallow_last_error(), "backing") && !log[0],
          "bad config");
    CHECK(fallow_create_from_env(&c, NULL) == EINVAL, "out NULL");
    unsetenv("FALLOW_ARENA_SIZE"); unsetenv("FALLOW_THP"); unsetenv("FALLOW_REPORT");
    unsetenv("FALLOW_REPORT_DELAY_MS"); unsetenv("FALLOW_ZEROING"); unsetenv("FALLOW_THRESHOLD");
    unsetenv("FALLOW_MEMORY_LIMIT");
    return 0;
}

/* The per-thread caches' settings: from fallow_cache_config, and from FALLOW_CACHE*. */
static int test_cache_settings(void) {
    fallow_cache_config k, got;
    fallow_cache_config_init(&k);
    CHECK(k.cache == 1 && k.max_order == 11 && k.batch_pages == 64 && k.high_pages == 1024, "defaults");
    fallow_allocator *a = NULL;
    fallow_stats s;
    void *p;
    k.max_order = 4; k.batch_pages = 8; k.high_pages = 64;
    CHECK(fallow_create_with_cache(NULL, &k, 0, &a) == 0 && a, "create with cache settings: %s", fallow_last_error());
    CHECK(fallow_cache_config_read(a, &got) == 0 && got.cache == 1 && got.max_order == 4 && got.batch_pages == 8 &&
          got.high_pages == 64, "read back %d %u %u %u", got.cache, got.max_order, got.batch_pages, got.high_pages);
    for (int i = 0; i < 4; i++) CHECK(fallow_alloc(a, 16384, 0, 0, &p) == 0 && fallow_free(a, p) == 0, "16 KiB pair");
    CHECK(fallow_stats_read(a, &s) == 0 && s.cache_hits > 0, "cached: %lu hits", (unsigned long)s.cache_hits);
    fallow_destroy(a);
    k.cache = 0;
    CHECK(fallow_create_with_cache(NULL, &k, 0, &a) == 0, "cache off");
    for (int i = 0; i < 4; i++) CHECK(fallow_alloc(a, 16384, 0, 0, &p) == 0 && fallow_free(a, p) == 0, "16 KiB pair");
    CHECK(fallow_stats_read(a, &s) == 0 && s.cache_hits == 0, "not cached: %lu hits", (unsigned long)s.cache_hits);
    fallow_destroy(a);
    /* Out of range: EINVAL naming the setting. */
    fallow_cache_config_init(&k); k.max_order = 12;
    CHECK(fallow_create_with_cache(NULL, &k, 0, &a) == EINVAL && strstr(fallow_last_error(), "cache_max_order"), "order");
    fallow_cache_config_init(&k); k.batch_pages = 2000;
    CHECK(fallow_create_with_cache(NULL, &k, 0, &a) == EINVAL && strstr(fallow_last_error(), "cache_batch_pages"), "batch");
    fallow_cache_config_init(&k); k.cache = 2;
    CHECK(fallow_create_with_cache(NULL, &k, 0, &a) == EINVAL && strstr(fallow_last_error(), "cache"), "flag");
    CHECK(fallow_create_with_cache(NULL, NULL, 0, NULL) == EINVAL, "out NULL");
    /* The environment, over the defaults or over the given settings; bad values warn once each. */
    char log[4096];
    setenv("FALLOW_CACHE_HIGH_PAGES", "128", 1);
    setenv("FALLOW_CACHE_MAX_ORDER", "5", 1);
    CHECK(create_from_env_logged(NULL, &a, log, sizeof log) == 0 && !log[0], "from env: %s", log);
    CHECK(fallow_cache_config_read(a, &got) == 0 && got.high_pages == 128 && got.max_order == 5 && got.batch_pages == 64,
          "env read back %u %u %u", got.high_pages, got.max_order, got.batch_pages);
    fallow_destroy(a);
    setenv("FALLOW_CACHE", "off", 1);
    fallow_cache_config_init(&k); k.batch_pages = 16;
    CHECK(fallow_create_with_cache(NULL, &k, 1, &a) == 0, "with cache and env");
    CHECK(fallow_cache_config_read(a, &got) == 0 && got.cache == 0 && got.high_pages == 128 && got.batch_pages == 16,
          "env over settings %d %u %u", got.cache, got.high_pages, got.batch_pages);
    fallow_destroy(a);
    setenv("FALLOW_CACHE", "maybe", 1);
    setenv("FALLOW_CACHE_BATCH_PAGES", "500", 1);
    CHECK(create_from_env_logged(NULL, &a, log, sizeof log) == 0 && a, "create despite bad values");
    fputs(log, stdout);
    CHECK(lines(log) == 2, "two warnings: %s", log);
    CHECK(strstr(log, "FALLOW_CACHE=\"maybe\" is not one of on, off; using the default on\n"), "cache: %s", log);
    CHECK(strstr(log, "FALLOW_CACHE_BATCH_PAGES=\"500\" is above 128; using 128\n"), "batch: %s", log);
    CHECK(fallow_cache_config_read(a, &got) == 0 && got.cache == 1 && got.batch_pages == 128, "values used");
    fallow_destroy(a);
    unsetenv("FALLOW_CACHE"); unsetenv("FALLOW_CACHE_HIGH_PAGES"); unsetenv("FALLOW_CACHE_MAX_ORDER");
    unsetenv("FALLOW_CACHE_BATCH_PAGES");
    return 0;
}

/* The error message is per thread. */
static void *other_thread(void *arg) {
    fallow_allocator *a = arg;
    void *p;
    fallow_alloc(a, 0, 0, 0, &p);
    return (void *)(strstr(fallow_last_error(), "zero bytes") != NULL ? (void *)1 : NULL);
}

static int test_threads(void) {
    fallow_allocator *a;
    CHECK(fallow_create(NULL, &a) == 0, "create");
    void *p;
    fallow_alloc(a, 4096, 3, 0, &p);
    pthread_t t; void *res;
    pthread_create(&t, NULL, other_thread, a);
    pthread_join(t, &res);
    CHECK(res == (void *)1, "other thread's message");
    CHECK(strstr(fallow_last_error(), "alignment"), "this thread's message kept: %s", fallow_last_error());
    fallow_destroy(a);
    return 0;
}

/* The edges of the block orders, as the preload's edges tests, smaller: for 2^k bytes from 8 KiB
 * to 16 MiB, the sizes a page and a byte below, a page below, a byte below, 2^k, a byte above, a
 * page above, a page and a byte above. Each order's sizes live at once (page-aligned, usable size
 * the size page-rounded, apart, marked at the first and last byte of every page), freed in a
 * shuffled order; then again with FALLOW_ZERO over the dirty memory just freed. At the end
 * nothing is live and the statistics add up. Workers off: no page moves between classes behind
 * the test's back. */
enum { EDGE_FIRST = 13, EDGE_LAST = 24, EDGES = 7 };
static size_t edge_size(int k, int e) {
    static const long delta[EDGES] = { -4097, -4096, -1, 0, 1, 4096, 4097 };
    return (size_t)((long)(1UL << k) + delta[e]);
}
static unsigned char edge_tag(unsigned seed, size_t off) { return (unsigned char)(seed * 131u + (off >> 12) * 7u + (off & 4095) + 1); }

static int test_edges(void) {
    fallow_config c; fallow_config_init(&c);
    c.arena_size = 512 * MiB;
    fallow_allocator *a;
    CHECK(fallow_create(&c, &a) == 0, "create");
    CHECK(fallow_set_tunable(a, "zeroing", 0) == 0 && fallow_set_tunable(a, "report", 0) == 0, "workers off");
    unsigned rng = 7;
    uint64_t calls = 0;
    int reused = 0;
    for (int k = EDGE_FIRST; k <= EDGE_LAST; k++) {
        uintptr_t dirty0[EDGES], dirty1[EDGES];
        for (int round = 0; round < 2; round++) {
            unsigned char *p[EDGES];
            size_t n[EDGES], pages = 0;
            for (int e = 0; e < EDGES; e++) {
                n[e] = edge_size(k, e);
                unsigned flags = round ? FALLOW_ZERO : 0;
                CHECK(fallow_alloc(a, n[e], 0, flags, (void **)&p[e]) == 0, "alloc(%zu, flags %u)", n[e], flags);
                calls++;
                size_t want = (n[e] + 4095) & ~(size_t)4095;
                CHECK((uintptr_t)p[e] % 4096 == 0 && fallow_usable_size(a, p[e]) == want,
                      "block of %zu at %p: usable size %zu, the size page-rounded is %zu", n[e], (void *)p[e], fallow_usable_size(a, p[e]), want);
                pages += want / 4096;
                if (round) {
                    for (size_t off = 0; off < n[e]; off += 4096) CHECK(p[e][off] == 0, "FALLOW_ZERO block of %zu: byte +%zu is %#x", n[e], off, p[e][off]);
                    for (size_t i = n[e] > 4096 ? n[e] - 4096 : 0; i < n[e]; i++) CHECK(p[e][i] == 0, "FALLOW_ZERO block of %zu: byte +%zu is %#x", n[e], i, p[e][i]);
                    int over = 0;
                    for (int d = 0; d < EDGES; d++) over |= (uintptr_t)p[e] < dirty1[d] && dirty0[d] < (uintptr_t)p[e] + n[e];
                    reused += over;
                } else {
                    memset(p[e], 0xA5, n[e]);
                    dirty0[e] = (uintptr_t)p[e]; dirty1[e] = dirty0[e] + n[e];
                }
                for (size_t off = 0; off < n[e]; off += 4096) {
                    size_t last = off + 4095 < n[e] ? off + 4095 : n[e] - 1;
                    p[e][off] = edge_tag(k * EDGES + e, off);
                    p[e][last] = edge_tag(k * EDGES + e, last);
                }
            }
            fallow_stats s;
            CHECK(fallow_stats_read(a, &s) == 0 && s.live_blocks == EDGES && s.bytes_in_use >= pages * 4096,
                  "order %d: %lu live blocks, %lu bytes in use (the blocks take %zu)", k, (unsigned long)s.live_blocks,
                  (unsigned long)s.bytes_in_use, pages * 4096);
            for (int i = 0; i < EDGES; i++)
                for (int j = i + 1; j < EDGES; j++)
                    CHECK((uintptr_t)p[i] + fallow_usable_size(a, p[i]) <= (uintptr_t)p[j] || (uintptr_t)p[j] + fallow_usable_size(a, p[j]) <= (uintptr_t)p[i],
                          "blocks of %zu at %p and %zu at %p overlap", n[i], (void *)p[i], n[j], (void *)p[j]);
            int order[EDGES];
            for (int i = 0; i < EDGES; i++) order[i] = i;
            for (int i = EDGES - 1; i > 0; i--) { int j = rand_r(&rng) % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t; }
            for (int i = 0; i < EDGES; i++) {
                int e = order[i];
                for (size_t off = 0; off < n[e]; off += 4096) {
                    size_t last = off + 4095 < n[e] ? off + 4095 : n[e] - 1;
                    CHECK(p[e][off] == edge_tag(k * EDGES + e, off) && p[e][last] == edge_tag(k * EDGES + e, last),
                          "block of %zu at %p: page +%zu lost its marks", n[e], (void *)p[e], off);
                }
                CHECK(fallow_free(a, p[e]) == 0, "free of the block of %zu", n[e]);
            }
        }
    }
    printf("  %d of %d FALLOW_ZERO blocks over memory just freed dirty\n", reused, (EDGE_LAST - EDGE_FIRST + 1) * EDGES);
    CHECK(reused > 0, "no FALLOW_ZERO block reused memory just freed dirty: the zeroing of dirty pages went untested");
    fallow_stats s;
    CHECK(fallow_stats_read(a, &s) == 0, "stats");
    CHECK(s.live_blocks == 0 && s.bytes_in_use == 0 && s.slack_bytes == 0, "nothing live: %lu blocks, %lu bytes in use, %lu slack",
          (unsigned long)s.live_blocks, (unsigned long)s.bytes_in_use, (unsigned long)s.slack_bytes);
    CHECK(s.alloc_calls == calls && s.free_calls == calls, "calls: %lu allocs, %lu frees, %lu each expected",
          (unsigned long)s.alloc_calls, (unsigned long)s.free_calls, (unsigned long)calls);
    uint64_t free_pages = s.free_dirty_pages + s.free_zeroed_pages + s.free_reported_pages + s.free_lazy_pages;
    CHECK(free_pages + s.isolated_pages == s.reserved_bytes / 4096, "free pages %lu (+ %lu isolated) of %lu reserved",
          (unsigned long)free_pages, (unsigned long)s.isolated_pages, (unsigned long)(s.reserved_bytes / 4096));
    CHECK(s.cached_pages <= free_pages, "cached pages %lu of %lu free", (unsigned long)s.cached_pages, (unsigned long)free_pages);
    uint64_t listed = 0;
    for (int k = 0; k < FALLOW_CLASSES; k++) for (int o = 0; o < FALLOW_ORDERS; o++) listed += s.free_blocks[k][o] << o;
    CHECK(listed == free_pages, "free blocks list %lu pages, %lu free", (unsigned long)listed, (unsigned long)free_pages);
    fallow_destroy(a);
    return 0;
}

/* fallow_trim gives every free resident page back at once (the workers would wait for their
 * delay) and keeps the live block's contents; a NULL allocator is refused. */
static int test_trim(void) {
    fallow_config c; fallow_config_init(&c);
    c.arena_size = 64 * MiB; c.max_order = 12;
    fallow_allocator *a;
    CHECK(fallow_create(&c, &a) == 0, "create");
    void *live, *freed[6];
    CHECK(fallow_alloc(a, 2 * MiB, 0, 0, &live) == 0, "alloc live");
    memset(live, 0x5a, 2 * MiB);
    for (int i = 0; i < 6; i++) {
        CHECK(fallow_alloc(a, MiB << (i % 3), 0, 0, &freed[i]) == 0, "alloc %d", i);
        memset(freed[i], 1, MiB << (i % 3));
    }
    for (int i = 0; i < 6; i++) CHECK(fallow_free(a, freed[i]) == 0, "free %d", i);
    fallow_stats s;
    CHECK(fallow_stats_read(a, &s) == 0 && s.free_dirty_pages > 0, "dirty pages free before the trim");
    uint64_t given = 0;
    CHECK(fallow_trim(a, 0, &given) == 0, "trim");
    CHECK(fallow_stats_read(a, &s) == 0, "stats");
    CHECK(s.free_dirty_pages == 0 && s.free_zeroed_pages == 0 && s.cached_pages == 0,
          "resident free pages left: %lu dirty, %lu zeroed, %lu cached", (unsigned long)s.free_dirty_pages,
          (unsigned long)s.free_zeroed_pages, (unsigned long)s.cached_pages);
    CHECK(given >= 8 * MiB, "given back %lu bytes", (unsigned long)given);
    CHECK(resident(freed[0], MiB) == 0, "a trimmed block is still resident");
    for (size_t i = 0; i < 2 * MiB; i += 4096) CHECK(((unsigned char *)live)[i] == 0x5a, "live block changed at %zu", i);
    CHECK(fallow_trim(a, 0, NULL) == 0, "trim with nothing to give");
    CHECK(fallow_free(a, live) == 0, "free live");
    fallow_destroy(a);
    errno = 0;
    CHECK(fallow_trim(NULL, 0, &given) == EINVAL && errno == EINVAL, "NULL allocator");
    return 0;
}

int main(void) {
    static const struct capi_test tests[] = {
        { "config_and_create", test_config_and_create },
        { "alloc_flags", test_alloc_flags },
        { "bad_pointers", test_bad_pointers },
        { "tunables", test_tunables },
        { "thread_local_errors", test_threads },
        { "from_env", test_from_env },
        { "cache_settings", test_cache_settings },
        { "edges", test_edges },
        { "trim", test_trim },
    };
    return RUN_TESTS(tests);
}

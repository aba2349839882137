/* Tests of libfallow_preload.so, run under LD_PRELOAD by scripts/test-capi.sh:
 *   preload_test [name...]     (no name: every test)
 * Each test prints "ok <name>" or "FAIL <name>: why" and the exit status is the number of
 * failures. Whether a block came from fallow is checked through fallow_preload_stats (looked up
 * with dlsym), so the tests fail if the library is not preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fallow.h> /* FALLOW_SMALL_MAX only: nothing of libfallow.so is called */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024UL * 1024)
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "  check failed at %s:%d: %s\n", __FILE__, __LINE__, #c); fprintf(stderr, "  " __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

enum { S_IN_USE, S_LIVE, S_SKIPPED, S_MEMSET, S_DIRTY, S_ZEROED, S_REPORTED, S_MOVES, S_COPIES,
       S_SMALL_LIVE, S_SMALL_BYTES, S_SPANS, S_SPAN_BYTES, S_FREE_SOLE, S_N };
static size_t (*stats_fn)(uint64_t *, size_t);
/* FALLOW_SMALL=1: every size is fallow's (small objects up to SMALL_MAX in spans, page blocks above). */
static int small_on;
#define SMALL_MAX ((size_t)FALLOW_SMALL_MAX)

/* S_LIVE and S_IN_USE count page blocks only: the small objects' spans (live page blocks, which
 * come and go with small objects, glibc's own included under FALLOW_SMALL=1) are left out. */
static uint64_t stat_of(int i) {
    uint64_t v[S_N] = {0};
    if (!stats_fn) stats_fn = (size_t (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "fallow_preload_stats");
    if (!stats_fn) { fprintf(stderr, "fallow_preload_stats not found: is libfallow_preload.so preloaded?\n"); exit(100); }
    stats_fn(v, S_N);
    if (i == S_LIVE) return v[S_LIVE] - v[S_SPANS];
    if (i == S_IN_USE) return v[S_IN_USE] - v[S_SPAN_BYTES];
    return v[i];
}

/* Run with FALLOW_ARENA_SIZE=1g FALLOW_ZEROING=off FALLOW_REPORT=off: the whole arena is dirtied first, so that calloc can only be
 * served from recycled (dirty) pages, which it must zero. */
static int test_calloc_recycled(void) {
    size_t arena = 1024 * MiB;
    uint64_t reported0 = stat_of(S_REPORTED);
    unsigned char *all = malloc(arena);
    CHECK(all && reported0 == 0 && stat_of(S_LIVE) == 1, "run with FALLOW_ARENA_SIZE=1g (reported pages %lu)", (unsigned long)reported0);
    (void)all;
    CHECK(stat_of(S_REPORTED) == 0, "the 1 GiB block did not take the whole arena");
    memset(all, 0xA5, arena);
    free(all);
    for (int round = 0; round < 20; round++) {
        size_t n = (1 + round % 7) * MiB + 12345;
        uint64_t live = stat_of(S_LIVE), memset_before = stat_of(S_MEMSET);
        unsigned char *q = calloc(1, n);
        CHECK(q, "calloc");
        CHECK(stat_of(S_LIVE) == live + 1, "calloc(%zu) not served by fallow", n);
        for (size_t i = 0; i < n; i++) CHECK(q[i] == 0, "byte %zu of recycled calloc is %#x", i, q[i]);
        CHECK(stat_of(S_MEMSET) >= memset_before + n - 4096, "recycled dirty pages were not memset (%lu -> %lu)",
              (unsigned long)memset_before, (unsigned long)stat_of(S_MEMSET));
        memset(q, 0x5A, n);
        free(q);
    }
    errno = 0;
    CHECK(calloc(SIZE_MAX / 2, 3) == NULL && errno == ENOMEM, "calloc overflow");
    return 0;
}

static int test_calloc_fresh(void) {
    /* Fresh (never touched) memory: zeroing is skipped. */
    uint64_t skipped = stat_of(S_SKIPPED);
    unsigned char *f = calloc(64, MiB);
    CHECK(f && f[0] == 0 && f[64 * MiB - 1] == 0, "fresh calloc");
    CHECK(stat_of(S_SKIPPED) >= skipped + 60 * MiB, "fresh pages were memset: skipped %lu -> %lu",
          (unsigned long)skipped, (unsigned long)stat_of(S_SKIPPED));
    free(f);
    return 0;
}

struct worker { int id; int iters; int failed; };

static uint64_t pattern(int id, int it, size_t off) { return ((uint64_t)id << 48) ^ ((uint64_t)it << 24) ^ off; }

static void *pattern_worker(void *arg) {
    struct worker *w = arg;
    enum { LIVE = 12 };
    struct { unsigned char *p; size_t n; int it; } live[LIVE] = {{0}};
    unsigned seed = 1234u + w->id;
    for (int it = 0; it < w->iters; it++) {
        int slot = rand_r(&seed) % LIVE;
        if (live[slot].p) {
            size_t n = live[slot].n;
            for (size_t off = 0; off + 8 <= n; off += 4096) {
                uint64_t v; memcpy(&v, live[slot].p + off, 8);
                if (v != pattern(w->id, live[slot].it, off)) { fprintf(stderr, "  thread %d: pattern broken at +%zu\n", w->id, off); w->failed = 1; }
            }
            free(live[slot].p);
            live[slot].p = NULL;
        }
        size_t n = 1024 + (size_t)(rand_r(&seed) % (6 * MiB));
        size_t align = (size_t)1 << (4 + rand_r(&seed) % 18); /* 16 B .. 2 MiB */
        unsigned char *p = NULL;
        switch (rand_r(&seed) % 4) {
        case 0: p = malloc(n); align = 16; break;
        case 1: if (posix_memalign((void **)&p, align, n)) p = NULL; break;
        case 2: n = (n + align - 1) / align * align; p = aligned_alloc(align, n); break;
        case 3: p = calloc(1, n); align = 16;
            for (size_t off = 0; off < n; off += 4096) if (p && p[off]) { fprintf(stderr, "  calloc not zero\n"); w->failed = 1; }
            break;
        }
        if (!p) { fprintf(stderr, "  thread %d: allocation of %zu failed\n", w->id, n); w->failed = 1; continue; }
        if ((uintptr_t)p % align) { fprintf(stderr, "  thread %d: %p not aligned to %zu\n", w->id, (void *)p, align); w->failed = 1; }
        if (malloc_usable_size(p) < n) { fprintf(stderr, "  usable size %zu < %zu\n", malloc_usable_size(p), n); w->failed = 1; }
        for (size_t off = 0; off + 8 <= n; off += 4096) { uint64_t v = pattern(w->id, it, off); memcpy(p + off, &v, 8); }
        live[slot].p = p; live[slot].n = n; live[slot].it = it;
    }
    for (int i = 0; i < LIVE; i++) free(live[i].p);
    return NULL;
}

static int test_threads(void) {
    enum { T = 6 };
    pthread_t th[T]; struct worker w[T];
    uint64_t live = stat_of(S_LIVE);
    for (int i = 0; i < T; i++) { w[i] = (struct worker){ i + 1, 400, 0 }; pthread_create(&th[i], NULL, pattern_worker, &w[i]); }
    for (int i = 0; i < T; i++) { pthread_join(th[i], NULL); CHECK(!w[i].failed, "thread %d", i); }
    CHECK(stat_of(S_LIVE) == live, "live blocks %lu before, %lu after", (unsigned long)live, (unsigned long)stat_of(S_LIVE));
    /* free goes straight to the owner's path of small objects once one is freed, only if they are
     * on: the pass-through keeps telling fallow's pointers from glibc's. */
    free(malloc(40));
    const char *small = getenv("FALLOW_SMALL");
    uint64_t sole = small && !strcmp(small, "1");
    CHECK(stat_of(S_FREE_SOLE) == sole, "free's path: %lu, small objects %s", (unsigned long)stat_of(S_FREE_SOLE), sole ? "on" : "off");
    return 0;
}

static void fill(unsigned char *p, size_t n, unsigned seed) { for (size_t i = 0; i < n; i += 511) p[i] = (unsigned char)(seed + i * 7); }
static int same(const unsigned char *p, size_t n, unsigned seed) { for (size_t i = 0; i < n; i += 511) if (p[i] != (unsigned char)(seed + i * 7)) return 0; return 1; }

static int test_realloc(void) {
    uint64_t live0 = stat_of(S_LIVE);
    unsigned char *p = malloc(300 * 1024);
    CHECK(p && stat_of(S_LIVE) == live0 + 1, "300 KiB not from fallow");
    fill(p, 300 * 1024, 1);
    size_t sizes[] = { 600 * 1024, 5 * MiB, 64 * MiB, 3 * MiB, 300 * 1024 };
    size_t have = 300 * 1024;
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t keep = have < sizes[i] ? have : sizes[i];
        p = realloc(p, sizes[i]);
        CHECK(p, "realloc to %zu", sizes[i]);
        CHECK(same(p, keep, 1), "prefix of %zu bytes lost at realloc to %zu", keep, sizes[i]);
        fill(p, sizes[i], 1);
        have = sizes[i];
    }
    /* Down across the threshold: glibc takes it over. */
    p = realloc(p, 1000);
    CHECK(p && same(p, 1000, 1), "shrink below threshold");
    CHECK(stat_of(S_LIVE) == live0, "fallow block not freed when crossing below the threshold");
    /* Up across the threshold from a glibc block. */
    p = realloc(p, 2 * MiB);
    CHECK(p && same(p, 1000, 1), "grow above threshold");
    CHECK(stat_of(S_LIVE) == live0 + 1, "grown block not from fallow");
    free(p);
    /* Force a move: a block with a live neighbour right after it cannot grow in place (9 MiB:
       above the per-thread caches, so both are placed side by side on the locked path). */
    uint64_t moves = stat_of(S_MOVES), copies = stat_of(S_COPIES);
    unsigned char *a = malloc(9 * MiB), *b = malloc(9 * MiB);
    CHECK(a && b, "two blocks");
    fill(a, 9 * MiB, 7);
    unsigned char *c = realloc(a, 40 * MiB);
    CHECK(c && same(c, 9 * MiB, 7), "moved block kept its contents");
    CHECK(stat_of(S_MOVES) + stat_of(S_COPIES) > moves + copies, "realloc neither moved nor copied");
    printf("  realloc 9 -> 40 MiB with a live neighbour: %s\n", stat_of(S_MOVES) > moves ? "pages moved (mremap)" : "bytes copied");
    /* The old place reads zero again when reused. */
    unsigned char *z = calloc(1, 8 * MiB);
    CHECK(z, "calloc after move");
    for (size_t i = 0; i < 8 * MiB; i += 4096) CHECK(z[i] == 0, "calloc after move not zero at %zu", i);
    free(z); free(b); free(c);
    errno = 0;
    CHECK(reallocarray(NULL, SIZE_MAX / 4, 8) == NULL && errno == ENOMEM, "reallocarray overflow");
    /* The pass-through to glibc: null, size 0, a product that wraps below the threshold. */
    errno = 0;
    CHECK(calloc(SIZE_MAX / 2 + 2, 2) == NULL && errno == ENOMEM, "calloc overflow that wraps below the threshold");
    unsigned char *s = realloc(NULL, 100);
    CHECK(s && stat_of(S_LIVE) == live0, "realloc(NULL, 100) not glibc's");
    fill(s, 100, 3);
    s = realloc(s, 200);
    CHECK(s && same(s, 100, 3) && stat_of(S_LIVE) == live0, "small realloc of a glibc block");
    CHECK(realloc(s, 0) == NULL, "realloc(glibc block, 0) frees it");
    p = malloc(1 * MiB);
    CHECK(p && stat_of(S_LIVE) == live0 + 1 && realloc(p, 0) == NULL, "realloc(fallow block, 0)");
    CHECK(stat_of(S_LIVE) == live0, "leaked blocks");
    return 0;
}

/* The edges of every block order from the threshold's (256 KiB) to 64 MiB: for 2^k bytes, the
 * sizes a page and a byte below, a page below, a byte below, 2^k, a byte above, a page above, a
 * page and a byte above. fallow serves a request of n pages with n pages (a run of free blocks,
 * or a cached power-of-two block whose slack is not the caller's), so its blocks are page-aligned
 * and malloc_usable_size is the size rounded up to a page; below the threshold glibc serves. These
 * tests run without FALLOW_THRESHOLD: the default, 256 KiB, applies. */
#define THRESHOLD (256 * 1024UL)
enum { ORDER_FIRST = 18, ORDER_LAST = 26, EDGES = 7 };
static size_t edge_size(int k, int e) {
    static const long delta[EDGES] = { -4097, -4096, -1, 0, 1, 4096, 4097 };
    return (size_t)((long)(1UL << k) + delta[e]);
}
static size_t page_up(size_t n) { return (n + 4095) & ~(size_t)4095; }

/* The byte marked at offset off of a block with this seed: differs from place to place (pages
 * included) and from seed to seed. */
static unsigned char tag(unsigned seed, size_t off) {
    uint32_t x = seed * 0x9E3779B1u ^ (uint32_t)off * 0x85EBCA77u ^ (uint32_t)(off >> 12) * 0xC2B2AE3Du;
    x ^= x >> 15; x *= 0x2C1B3C6Du; x ^= x >> 12;
    return (unsigned char)(x ^ (x >> 8) ^ (x >> 16));
}
/* Marks: the first, a middle and the last byte of every page, and the last byte of the block. */
static const size_t in_page[3] = { 0, 2048, 4095 };
static void mark(unsigned char *p, size_t n, unsigned seed) {
    for (size_t off = 0; off < n; off += 4096)
        for (int i = 0; i < 3 && off + in_page[i] < n; i++) p[off + in_page[i]] = tag(seed, off + in_page[i]);
    p[n - 1] = tag(seed, n - 1);
}
/* The first offset below len where the marks of a block of n bytes are not found; SIZE_MAX if none. */
static size_t unmarked(const unsigned char *p, size_t n, size_t len, unsigned seed) {
    size_t lim = n < len ? n : len;
    for (size_t off = 0; off < lim; off += 4096)
        for (int i = 0; i < 3 && off + in_page[i] < lim; i++)
            if (p[off + in_page[i]] != tag(seed, off + in_page[i])) return off + in_page[i];
    if (n - 1 < len && p[n - 1] != tag(seed, n - 1)) return n - 1;
    return SIZE_MAX;
}

struct edge_block { unsigned char *p; size_t n; unsigned seed; };

/* A block just returned by `how` while `live` fallow page blocks were live before: a page block
 * of fallow's iff at least the threshold (with small objects on, iff above SMALL_MAX: below, a
 * small object), page-aligned and page-granular if so, usable for its size. Below the threshold,
 * from a quarter of it (with small objects on, from a quarter of SMALL_MAX but no less than the
 * smallest hot block, 64 KiB, to SMALL_MAX), the block this thread freed last may serve it
 * (test_hot_below). */
static int check_edge_block(const struct edge_block *b, uint64_t live, const char *how) {
    CHECK(b->p, "%s(%zu) failed", how, b->n);
    int fallow = small_on ? b->n > SMALL_MAX : b->n >= THRESHOLD;
    if (small_on ? b->n >= SMALL_MAX / 4 && b->n <= SMALL_MAX : b->n >= THRESHOLD / 4 && b->n < THRESHOLD)
        fallow = stat_of(S_LIVE) == live + 1;
    CHECK(stat_of(S_LIVE) == live + fallow, "%s(%zu) %s served by a fallow page block (live blocks %lu -> %lu)", how, b->n,
          fallow ? "not" : "was", (unsigned long)live, (unsigned long)stat_of(S_LIVE));
    size_t u = malloc_usable_size(b->p);
    CHECK(u >= b->n, "%s(%zu): usable size %zu", how, b->n, u);
    if (fallow)
        CHECK(u == page_up(b->n) && (uintptr_t)b->p % 4096 == 0,
              "%s(%zu): fallow block %p of usable size %zu (the size page-rounded: %zu)", how, b->n, (void *)b->p, u, page_up(b->n));
    return 0;
}

/* Live blocks lie apart: their usable ranges are disjoint. */
static int check_disjoint(const struct edge_block *b, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            uintptr_t a0 = (uintptr_t)b[i].p, a1 = a0 + malloc_usable_size(b[i].p);
            uintptr_t b0 = (uintptr_t)b[j].p, b1 = b0 + malloc_usable_size(b[j].p);
            CHECK(a1 <= b0 || b1 <= a0, "blocks of %zu and %zu bytes overlap: [%#lx, %#lx) and [%#lx, %#lx)",
                  b[i].n, b[j].n, (unsigned long)a0, (unsigned long)a1, (unsigned long)b0, (unsigned long)b1);
        }
    return 0;
}

static int check_marks(const struct edge_block *b, const char *when) {
    size_t at = unmarked(b->p, b->n, b->n, b->seed);
    CHECK(at == SIZE_MAX, "block of %zu bytes at %p: mark at +%zu lost %s", b->n, (void *)b->p, at, when);
    return 0;
}

/* Check every block's marks, then free them in an order shuffled by *seed, each checked again
 * just before. */
static int free_shuffled(struct edge_block *b, int n, unsigned *seed) {
    int order[EDGES];
    for (int i = 0; i < n; i++) { order[i] = i; if (check_marks(&b[i], "while all were live")) return 1; }
    for (int i = n - 1; i > 0; i--) { int j = rand_r(seed) % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t; }
    for (int i = 0; i < n; i++) {
        struct edge_block *x = &b[order[i]];
        if (check_marks(x, "before its free, others freed")) return 1;
        free(x->p);
        x->p = NULL;
    }
    return 0;
}

/* malloc: all sizes of an order live at once, marked, checked, freed in a shuffled order. */
static int test_edges_malloc(void) {
    uint64_t live0 = stat_of(S_LIVE), in_use0 = stat_of(S_IN_USE);
    unsigned seed = 18;
    for (int k = ORDER_FIRST; k <= ORDER_LAST; k++) {
        struct edge_block b[EDGES];
        uint64_t fallow_n = 0, fallow_bytes = 0;
        for (int e = 0; e < EDGES; e++) {
            uint64_t live = stat_of(S_LIVE);
            b[e] = (struct edge_block){ malloc(edge_size(k, e)), edge_size(k, e), (unsigned)(k * EDGES + e) };
            if (check_edge_block(&b[e], live, "malloc")) return 1;
            mark(b[e].p, b[e].n, b[e].seed);
            if (stat_of(S_LIVE) == live + 1) { fallow_n++; fallow_bytes += page_up(b[e].n); }
        }
        CHECK(stat_of(S_LIVE) == live0 + fallow_n, "order %d: %lu live blocks, %lu expected", k,
              (unsigned long)stat_of(S_LIVE), (unsigned long)(live0 + fallow_n));
        CHECK(stat_of(S_IN_USE) >= in_use0 + fallow_bytes, "order %d: %lu bytes in use, the blocks take %lu", k,
              (unsigned long)(stat_of(S_IN_USE) - in_use0), (unsigned long)fallow_bytes);
        if (check_disjoint(b, EDGES) || free_shuffled(b, EDGES, &seed)) return 1;
    }
    CHECK(stat_of(S_LIVE) == live0, "live blocks %lu before, %lu after", (unsigned long)live0, (unsigned long)stat_of(S_LIVE));
    CHECK(stat_of(S_IN_USE) == in_use0, "bytes in use %lu before, %lu after", (unsigned long)in_use0, (unsigned long)stat_of(S_IN_USE));
    return 0;
}

/* Every byte of the first, last and six pages between of the first n bytes, and the first byte of
 * every page, read zero; the offset of the first that does not, or SIZE_MAX. */
static size_t nonzero_at(const unsigned char *p, size_t n) {
    size_t pages = (n + 4095) / 4096;
    for (size_t off = 0; off < n; off += 4096) if (p[off]) return off;
    for (size_t s = 0; s < 8; s++) {
        size_t off = (pages - 1) * s / 7 * 4096;
        for (size_t i = off; i < off + 4096 && i < n; i++) if (p[i]) return i;
    }
    return SIZE_MAX;
}

/* calloc, into memory just freed dirty: per order, malloc all sizes and fill them, free them,
 * calloc them again: they read zero, at least some of them where dirty blocks just were. */
static int test_edges_calloc(void) {
    uint64_t live0 = stat_of(S_LIVE), in_use0 = stat_of(S_IN_USE);
    unsigned seed = 26;
    int reused = 0, blocks = 0;
    for (int k = ORDER_FIRST; k <= ORDER_LAST; k++) {
        struct edge_block b[EDGES];
        uintptr_t dirty0[EDGES], dirty1[EDGES];
        for (int e = 0; e < EDGES; e++) {
            uint64_t live = stat_of(S_LIVE);
            b[e] = (struct edge_block){ malloc(edge_size(k, e)), edge_size(k, e), (unsigned)(1000 + k * EDGES + e) };
            if (check_edge_block(&b[e], live, "malloc")) return 1;
            memset(b[e].p, 0xA5, b[e].n);
            mark(b[e].p, b[e].n, b[e].seed);
            dirty0[e] = (uintptr_t)b[e].p;
            dirty1[e] = dirty0[e] + b[e].n;
        }
        if (check_disjoint(b, EDGES) || free_shuffled(b, EDGES, &seed)) return 1;
        for (int e = 0; e < EDGES; e++) {
            uint64_t live = stat_of(S_LIVE);
            b[e] = (struct edge_block){ calloc(1, edge_size(k, e)), edge_size(k, e), (unsigned)(2000 + k * EDGES + e) };
            if (check_edge_block(&b[e], live, "calloc")) return 1;
            size_t at = nonzero_at(b[e].p, b[e].n);
            CHECK(at == SIZE_MAX, "calloc(%zu) at %p: byte +%zu is %#x", b[e].n, (void *)b[e].p, at, b[e].p[at]);
            uintptr_t c0 = (uintptr_t)b[e].p, c1 = c0 + b[e].n;
            int over = 0;
            for (int d = 0; d < EDGES; d++) over |= c0 < dirty1[d] && dirty0[d] < c1;
            reused += over;
            blocks++;
            mark(b[e].p, b[e].n, b[e].seed);
        }
        if (check_disjoint(b, EDGES) || free_shuffled(b, EDGES, &seed)) return 1;
    }
    printf("  %d of %d calloc blocks over memory just freed dirty\n", reused, blocks);
    CHECK(reused > 0, "no calloc block reused memory just freed dirty: the zeroing of dirty pages went untested");
    CHECK(stat_of(S_LIVE) == live0, "live blocks %lu before, %lu after", (unsigned long)live0, (unsigned long)stat_of(S_LIVE));
    CHECK(stat_of(S_IN_USE) == in_use0, "bytes in use %lu before, %lu after", (unsigned long)in_use0, (unsigned long)stat_of(S_IN_USE));
    return 0;
}

/* realloc across the edges: up through every order, each order's sizes zigzagging across 2^k,
 * then back down; the contents kept up to the smaller size at every step. */
static int test_edges_realloc(void) {
    static const int zigzag[EDGES] = { 2, 6, 0, 4, 3, 5, 1 }; /* -1, +4097, -4097, +1, 0, +4096, -4096 */
    enum { STEPS = 2 * (ORDER_LAST - ORDER_FIRST + 1) * EDGES };
    size_t sizes[STEPS];
    int n = 0;
    for (int k = ORDER_FIRST; k <= ORDER_LAST; k++) for (int e = 0; e < EDGES; e++) sizes[n++] = edge_size(k, zigzag[e]);
    for (int i = n - 1; i >= 0; i--) sizes[n + (n - 1 - i)] = sizes[i];
    n *= 2;
    uint64_t live0 = stat_of(S_LIVE), in_use0 = stat_of(S_IN_USE);
    struct edge_block b = { malloc(sizes[0]), sizes[0], 5000 };
    if (check_edge_block(&b, live0, "malloc")) return 1;
    mark(b.p, b.n, b.seed);
    for (int i = 1; i < n; i++) {
        size_t keep = b.n < sizes[i] ? b.n : sizes[i];
        struct edge_block c = { realloc(b.p, sizes[i]), sizes[i], b.seed + 1 };
        if (check_edge_block(&c, live0, "realloc")) return 1;
        size_t at = unmarked(c.p, b.n, keep, b.seed);
        CHECK(at == SIZE_MAX, "realloc %zu -> %zu (%p -> %p): byte +%zu of the %zu kept lost", b.n, c.n, (void *)b.p,
              (void *)c.p, at, keep);
        mark(c.p, c.n, c.seed);
        b = c;
    }
    free(b.p);
    CHECK(stat_of(S_LIVE) == live0, "live blocks %lu before, %lu after", (unsigned long)live0, (unsigned long)stat_of(S_LIVE));
    CHECK(stat_of(S_IN_USE) == in_use0, "bytes in use %lu before, %lu after", (unsigned long)in_use0, (unsigned long)stat_of(S_IN_USE));
    return 0;
}

/* A block of 2^(k+1) bytes freed dirty, then two edge sizes that together fit in it (one may
 * land in the tail of the other's run): apart, and each keeps its contents. */
static int test_edges_tail(void) {
    static const int pairs[][2] = { { 5, 1 }, { 4, 0 }, { 3, 2 }, { 1, 5 } }; /* +4096 -4096, +1 -4097, 0 -1, -4096 +4096 */
    uint64_t live0 = stat_of(S_LIVE), in_use0 = stat_of(S_IN_USE);
    int inside = 0, tailed = 0, tries = 0;
    for (int k = ORDER_FIRST; k <= ORDER_LAST; k++) {
        for (unsigned i = 0; i < sizeof pairs / sizeof *pairs; i++) {
            size_t big = 2UL << k;
            uint64_t live = stat_of(S_LIVE);
            struct edge_block g = { malloc(big), big, 0 };
            if (check_edge_block(&g, live, "malloc")) return 1;
            memset(g.p, 0x3C, big);
            uintptr_t g0 = (uintptr_t)g.p, g1 = g0 + big;
            free(g.p);
            struct edge_block b[2];
            for (int j = 0; j < 2; j++) {
                live = stat_of(S_LIVE);
                b[j] = (struct edge_block){ malloc(edge_size(k, pairs[i][j])), edge_size(k, pairs[i][j]), (unsigned)(7000 + 10 * k + 2 * i + j) };
                if (check_edge_block(&b[j], live, "malloc")) return 1;
                mark(b[j].p, b[j].n, b[j].seed);
            }
            if (check_disjoint(b, 2) || check_marks(&b[0], "with the second block live") || check_marks(&b[1], "with the first block live"))
                return 1;
            int in = 1;
            for (int j = 0; j < 2; j++) in &= (uintptr_t)b[j].p >= g0 && (uintptr_t)b[j].p + b[j].n <= g1;
            inside += in;
            tailed += (uintptr_t)b[1].p == (uintptr_t)b[0].p + page_up(b[0].n) || (uintptr_t)b[0].p == (uintptr_t)b[1].p + page_up(b[1].n);
            tries++;
            free(b[i & 1].p);
            if (check_marks(&b[!(i & 1)], "after the other was freed")) return 1;
            free(b[!(i & 1)].p);
        }
    }
    printf("  %d of %d pairs both in the block just freed, %d right after one another\n", inside, tries, tailed);
    CHECK(tailed > 0, "no block of a pair started where the other's pages end: the tail of a run went untested");
    CHECK(stat_of(S_LIVE) == live0, "live blocks %lu before, %lu after", (unsigned long)live0, (unsigned long)stat_of(S_LIVE));
    CHECK(stat_of(S_IN_USE) == in_use0, "bytes in use %lu before, %lu after", (unsigned long)in_use0, (unsigned long)stat_of(S_IN_USE));
    return 0;
}

/* A loop of sizes on both sides of the threshold stays in one block: a `malloc` or `calloc`
 * below the threshold, from a quarter of it, right after this thread freed a larger fallow block
 * that may hold it, gets that block (its address, a fallow page block, its usable size the
 * request's pages); `calloc`'s bytes read zero though the block was written. A request below a
 * quarter of the threshold, or one made while that block is live, is glibc's; `realloc` of a
 * block served so to a size below the threshold moves it to glibc with its bytes. Run alone with
 * the workers off (`hot_below`): the zeroing worker may zero a cached block of the request's
 * order, which a `calloc` then prefers. */
static int test_hot_below(void) {
    uint64_t live0 = stat_of(S_LIVE);
    unsigned char *a = malloc(300 * 1024);
    CHECK(a && stat_of(S_LIVE) == live0 + 1, "malloc(300 KiB) not a fallow block");
    memset(a, 0x5A, 300 * 1024);
    free(a);
    unsigned char *b = malloc(200 * 1024);
    CHECK(b == a, "malloc(200 KiB) after freeing a 300 KiB block: %p, not the block freed (%p)", (void *)b, (void *)a);
    CHECK(stat_of(S_LIVE) == live0 + 1 && malloc_usable_size(b) == 200 * 1024, "the block served below the threshold: live %lu, usable %zu",
          (unsigned long)stat_of(S_LIVE), malloc_usable_size(b));
    memset(b, 0x77, 200 * 1024);
    free(b);
    unsigned char *c = calloc(1, 150 * 1024 + 5);
    CHECK(c == a, "calloc(150 KiB) after freeing that block: %p, not the block (%p)", (void *)c, (void *)a);
    CHECK(nonzero_at(c, 150 * 1024 + 5) == SIZE_MAX, "calloc's block not zeroed at byte %zu", nonzero_at(c, 150 * 1024 + 5));
    unsigned char *d = malloc(THRESHOLD / 4 - 4096);
    CHECK(d && d != a && stat_of(S_LIVE) == live0 + 1, "malloc below a quarter of the threshold served by fallow");
    free(d);
    fill(c, 150 * 1024, 3);
    unsigned char *e = realloc(c, 100 * 1024);
    CHECK(e && e != c && stat_of(S_LIVE) == live0 && same(e, 100 * 1024, 3), "realloc below the threshold: not moved to glibc with its bytes");
    free(e);
    /* The block is free again (the move freed it): it serves the next request below the
     * threshold, and while that one lives, the one after is glibc's. */
    unsigned char *f = malloc(200 * 1024), *g = malloc(200 * 1024);
    CHECK(f == a && g && g != a && stat_of(S_LIVE) == live0 + 1, "two requests below the threshold: %p and %p from the block %p freed last",
          (void *)f, (void *)g, (void *)a);
    free(g);
    free(f);
    CHECK(stat_of(S_LIVE) == live0, "live blocks %lu before, %lu after", (unsigned long)live0, (unsigned long)stat_of(S_LIVE));
    return 0;
}

static int test_aligned(void) {
    void *p;
    CHECK(posix_memalign(&p, 2 * MiB, 3 * MiB) == 0 && (uintptr_t)p % (2 * MiB) == 0, "posix_memalign 2 MiB");
    free(p);
    CHECK(posix_memalign(&p, 24, 1 * MiB) == EINVAL, "posix_memalign bad alignment");
    p = aligned_alloc(65536, 1 * MiB); CHECK(p && (uintptr_t)p % 65536 == 0, "aligned_alloc"); free(p);
    p = memalign(3000, 1 * MiB); CHECK(p && (uintptr_t)p % 4096 == 0, "memalign rounds 3000 up"); free(p);
    p = valloc(1 * MiB); CHECK(p && (uintptr_t)p % 4096 == 0, "valloc"); free(p);
    p = pvalloc(1 * MiB + 1); CHECK(p && malloc_usable_size(p) >= 1 * MiB + 4096, "pvalloc rounds up"); free(p);
    p = malloc(1 * MiB + 1); CHECK(p && malloc_usable_size(p) == 1 * MiB + 4096, "usable size of a fallow block: %zu", malloc_usable_size(p)); free(p);
    p = malloc(100); CHECK(p && malloc_usable_size(p) >= 100 && malloc_usable_size(p) < 4096, "usable size of a glibc block"); free(p);
    CHECK(malloc_usable_size(NULL) == 0, "usable size of NULL");
    return 0;
}

static volatile int stop_workers;
static void *churn(void *arg) {
    (void)arg;
    unsigned seed = 99;
    while (!stop_workers) {
        size_t n = 256 * 1024 + rand_r(&seed) % (4 * MiB);
        unsigned char *p = (rand_r(&seed) & 1) ? malloc(n) : calloc(1, n);
        if (p) { p[0] = 1; p[n - 1] = 2; }
        void *s = malloc(rand_r(&seed) % 2000 + 1);
        free(p); free(s);
    }
    return NULL;
}

static int test_fork_threads(void) {
    enum { T = 4, FORKS = 60 };
    pthread_t th[T];
    stop_workers = 0;
    for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, churn, NULL);
    int bad = 0;
    for (int f = 0; f < FORKS; f++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(30); /* a deadlock shows as SIGALRM */
            unsigned char *p = calloc(1, 3 * MiB);
            if (!p) _exit(2);
            for (size_t i = 0; i < 3 * MiB; i += 4096) if (p[i]) _exit(3);
            memset(p, 1, 3 * MiB);
            p = realloc(p, 20 * MiB);
            if (!p || p[3 * MiB - 1] != 1) _exit(4);
            free(p);
            void *s = malloc(10); free(s);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "  child %d: %s %d\n", f, WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
            bad++;
        }
    }
    stop_workers = 1;
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    CHECK(bad == 0, "%d of %d children failed", bad, FORKS);
    return 0;
}

/* Run fn in a child with stderr captured; expect SIGABRT and `want` in the message. */
static int expect_abort(void (*fn)(char *addr_out), const char *want) {
    int fds[2];
    if (pipe(fds)) return 1;
    char addr[64] = {0};
    int afd[2];
    if (pipe(afd)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2); close(fds[0]); close(afd[0]);
        struct rlimit no_core = {0, 0}; setrlimit(RLIMIT_CORE, &no_core);
        char a[64] = {0};
        fn(a);
        _exit(0); /* not reached when fn aborts as it must */
    }
    close(fds[1]); close(afd[1]);
    char buf[1024] = {0};
    ssize_t n, got = 0;
    while ((n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += n;
    close(fds[0]); close(afd[0]);
    int st; waitpid(pid, &st, 0);
    (void)addr;
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child was not aborted (status %#x), stderr: %s", st, buf);
    CHECK(strstr(buf, want) != NULL, "stderr %s lacks \"%s\"", buf, want);
    printf("  message: %s", buf);
    return 0;
}

static char expected[128];
static void *volatile victim;
static void invalid_free(char *a) { (void)a; free((char *)victim + 8192); }
static void double_free(char *a) { (void)a; void *v = victim; free(v); v = victim; free(v); }
static void never_allocated(char *a) { (void)a; free((char *)victim + 64 * MiB + 16); }

static int test_bad_free(void) {
    victim = malloc(1 * MiB);
    CHECK(victim && stat_of(S_LIVE) > 0, "victim from fallow");
    snprintf(expected, sizeof expected, "fallow: free(): invalid pointer %p", (void *)((char *)victim + 8192));
    if (expect_abort(invalid_free, expected)) return 1;
    snprintf(expected, sizeof expected, "fallow: free(): invalid pointer %p", (void *)((char *)victim + 64 * MiB + 16));
    if (expect_abort(never_allocated, expected)) return 1;
    snprintf(expected, sizeof expected, "fallow: free(): double free %p", victim);
    if (expect_abort(double_free, expected)) return 1;
    free(victim);
    return 0;
}

static int test_exhaustion(void) {
    errno = 0;
    CHECK(malloc(SIZE_MAX / 2) == NULL && errno == ENOMEM, "malloc(SIZE_MAX/2)");
    pid_t pid = fork();
    if (pid == 0) {
        /* Limit the address space to what is mapped now + 2 GiB, then take 512 MiB blocks
         * (without touching them) until refused: fallow's reservation is used up, glibc's mmap
         * is refused too, and the answer must be NULL + ENOMEM. */
        void *first = malloc(1 * MiB); /* the allocator exists before the limit */
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (!f || fscanf(f, "%lu", &pages) != 1) _exit(10);
        fclose(f);
        struct rlimit r = { pages * 4096 + 2048 * MiB, pages * 4096 + 2048 * MiB };
        if (setrlimit(RLIMIT_AS, &r)) _exit(11);
        int n = 0;
        for (; n < 200; n++) {
            errno = 0;
            if (!malloc(512 * MiB)) break;
        }
        if (n == 200) _exit(12);          /* never refused */
        if (errno != ENOMEM) _exit(13);
        free(first);
        _exit(0);
    }
    int st; waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exhaustion child status %#x", st);
    return 0;
}

/* Open descriptors, less the ones the background workers hold for a moment when they start or
 * read the CPU load (/proc/loadavg; under /sys: the CPUs online, the cgroup's CPU quota; the
 * PSI file): those come and go at any time. */
static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd"); int n = 0;
    struct dirent *e;
    char path[64], target[256];
    if (!d) return -1;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof target - 1);
        /* Gone since readdir: a descriptor a worker held for one read. */
        if (k <= 0) continue;
        target[k] = 0;
        n++;
    }
    closedir(d);
    return n;
}
/* Descriptors held for good: the fewest of several counts, as a worker holds one for a moment
 * now and then (open, read, close of /proc/loadavg and the like). A leak shows in every count. */
static int count_held_fds(void) {
    int least = count_fds();
    for (int i = 0; i < 5; i++) {
        usleep(1000);
        int n = count_fds();
        if (n < least) least = n;
    }
    return least;
}
static int count_lines(const char *path) {
    FILE *f = fopen(path, "r"); int n = 0, c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static int test_fork_exec(void) {
    enum { N = 2000 };
    void *big = malloc(4 * MiB); /* the allocator and its fork handlers exist */
    CHECK(big && stat_of(S_LIVE) > 0, "allocator created");
    int fds0 = count_held_fds(), maps0 = count_lines("/proc/self/maps");
    double t0 = now(), first = 0;
    for (int i = 0; i < N; i++) {
        void *p = malloc(1 * MiB + i); /* the parent keeps allocating between forks */
        pid_t pid = fork();
        if (pid == 0) { execl("/bin/true", "true", (char *)NULL); _exit(127); }
        int st;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", i);
        free(p);
        if (i == N / 10 - 1) first = now() - t0;
    }
    double total = now() - t0;
    int fds1 = count_held_fds(), maps1 = count_lines("/proc/self/maps");
    printf("  %d fork+exec: first 10%% %.2f s, last 90%% %.2f s (%.2f ms each), fds %d -> %d, mappings %d -> %d\n",
           N, first, total - first, (total - first) * 1000 / (N - N / 10), fds0, fds1, maps0, maps1);
    CHECK(fds1 == fds0, "descriptors leaked: %d -> %d", fds0, fds1);
    CHECK(maps1 <= maps0 + 2, "mappings grew: %d -> %d", maps0, maps1);
    free(big);
    return 0;
}

/* For the shell script: `preload_test threshold N`: blocks of N-1 bytes come from glibc, of N
 * bytes from fallow. */
static int test_threshold(size_t t) {
    uint64_t live = stat_of(S_LIVE);
    void *big0 = malloc(64 * MiB); /* create the allocator whatever the threshold */
    CHECK(big0, "64 MiB");
    live = stat_of(S_LIVE);
    void *below = malloc(t - 1);
    /* FALLOW_SMALL=1: no threshold, every size is fallow's: a page block above SMALL_MAX, a
     * small object (not counted here) up to it. */
    int below_block = small_on && t - 1 > SMALL_MAX, at_block = !small_on || t > SMALL_MAX;
    CHECK(stat_of(S_LIVE) == live + below_block, "%zu bytes (threshold - 1): %s a fallow page block", t - 1, below_block ? "not" : "");
    void *at = malloc(t);
    CHECK(stat_of(S_LIVE) == live + below_block + at_block, "%zu bytes (the threshold): %s a fallow page block", t, at_block ? "not" : "");
    free(below); free(at); free(big0);
    return 0;
}

/* In a fresh process (`preload_test start_race`): 16 threads whose first requests, large, race
 * through a barrier while nothing has created the allocator yet. The threads that find it being
 * created wait for it, so every block is fallow's. */
enum { RACERS = 16 };
static pthread_barrier_t race_barrier;
static void *racer(void *arg) {
    pthread_barrier_wait(&race_barrier);
    unsigned char *p = malloc(64 * MiB);
    if (p) p[0] = 1;
    *(void **)arg = p;
    return NULL;
}

static int test_start_race(void) {
    pthread_t th[RACERS];
    void *blocks[RACERS] = {0};
    uint64_t v[S_N];
    CHECK(stat_of(S_LIVE) == 0 && stats_fn(v, S_N) == 0, "run in a fresh process: the allocator exists already");
    pthread_barrier_init(&race_barrier, NULL, RACERS);
    for (int i = 0; i < RACERS; i++) pthread_create(&th[i], NULL, racer, &blocks[i]);
    for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < RACERS; i++) CHECK(blocks[i], "thread %d: malloc(64 MiB) failed", i);
    CHECK(stat_of(S_LIVE) == RACERS, "%lu of %d racing blocks came from fallow", (unsigned long)stat_of(S_LIVE), RACERS);
    CHECK(stat_of(S_IN_USE) == RACERS * 64 * MiB, "bytes in use %lu", (unsigned long)stat_of(S_IN_USE));
    for (int i = 0; i < RACERS; i++) free(blocks[i]);
    CHECK(stat_of(S_LIVE) == 0, "live blocks after freeing all: %lu", (unsigned long)stat_of(S_LIVE));
    return 0;
}

/* Under `ulimit -v 4194304` (RLIMIT_AS 4 GiB, far below the arena the machine's RAM would ask
 * for), in a fresh process (`preload_test rlimit`): the allocator is created and serves a large
 * block; a request beyond the limit, and then requests until the room is used up, get NULL with
 * errno ENOMEM (fallow refuses, then glibc refuses). */
static int test_rlimit(void) {
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur <= 8192 * MiB,
          "run under ulimit -v (4 GiB or less)");
    unsigned char *p = malloc(256 * MiB);
    CHECK(p && stat_of(S_LIVE) == 1, "256 MiB under the limit not served by fallow");
    p[256 * MiB - 1] = 1;
    errno = 0;
    CHECK(malloc(r.rlim_cur) == NULL && errno == ENOMEM, "malloc of the whole limit: errno %d", errno);
    void *held[64];
    int n = 0;
    for (; n < 64; n++) {
        errno = 0;
        if (!(held[n] = malloc(512 * MiB))) break;
    }
    CHECK(n < 64 && errno == ENOMEM, "512 MiB blocks until refused: %d taken, errno %d", n, errno);
    CHECK(stat_of(S_LIVE) >= 2, "no 512 MiB block from fallow");
    printf("  under RLIMIT_AS %lu MiB: %d blocks of 512 MiB, then NULL + ENOMEM\n", (unsigned long)(r.rlim_cur / MiB), n);
    while (n > 0) free(held[--n]);
    free(p);
    CHECK(stat_of(S_LIVE) == 0, "leaked blocks");
    return 0;
}

static int zeros_workload(void) {
    /* `np.zeros`-like: calloc, touch, free, repeatedly. */
    for (int i = 0; i < 50; i++) {
        unsigned char *p = calloc(32, MiB);
        if (!p) return 1;
        for (size_t j = 0; j < 32 * MiB; j += 4096) p[j] = 1;
        free(p);
    }
    return 0;
}

struct test { const char *name; int (*fn)(void); };
static const struct test tests[] = {
    { "calloc_fresh", test_calloc_fresh },
    { "threads", test_threads },
    { "realloc", test_realloc },
    { "aligned", test_aligned },
    { "fork_threads", test_fork_threads },
    { "bad_free", test_bad_free },
    { "exhaustion", test_exhaustion },
    { "zeros_workload", zeros_workload },
    { "edges_malloc", test_edges_malloc },
    { "edges_calloc", test_edges_calloc },
    { "edges_realloc", test_edges_realloc },
    { "edges_tail", test_edges_tail },
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *sm = getenv("FALLOW_SMALL");
    small_on = sm && !strcmp(sm, "1");
    /* Tests run alone, each in a fresh process: fork time grows with the parent's resident
     * memory, which the other tests leave high (free dirty pages stay resident until reported);
     * the allocator's creation, the address-space limit and the first requests are per process. */
    static const struct { const char *name; int (*run)(void); } alone[] = {
        { "calloc_recycled", test_calloc_recycled },
        { "fork_exec", test_fork_exec },
        { "start_race", test_start_race },
        { "rlimit", test_rlimit },
        { "hot_below", test_hot_below },
    };
    for (size_t i = 0; argc == 2 && i < sizeof alone / sizeof alone[0]; i++) {
        if (!strcmp(argv[1], alone[i].name)) {
            int r = alone[i].run();
            printf("%s %s\n", r ? "FAIL" : "ok", alone[i].name);
            return r;
        }
    }
    if (argc == 3 && !strcmp(argv[1], "threshold")) {
        int r = test_threshold(strtoull(argv[2], NULL, 0));
        printf("%s threshold %s\n", r ? "FAIL" : "ok", argv[2]);
        return r;
    }
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

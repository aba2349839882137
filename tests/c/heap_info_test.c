/* glibc's calls on the whole heap under the preload (scripts/test-capi.sh, with small objects
 * on and off): malloc_trim gives fallow's free memory back at once (the workers would wait for
 * their delay), mallinfo2 and mallinfo count fallow's blocks, malloc_stats prints fallow's
 * figures after glibc's. Prints "ok <name>" per test; exit status = number of failures. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024UL * 1024)
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "  check failed at %s:%d: %s: ", __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

/* The process's resident set, in bytes. */
static size_t rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
    return res * 4096;
}

/* Blocks of 4 MiB (fallow's, whatever the threshold), 40 MiB in all. Freed, they merge into one
 * block of 32 MiB or more, which the reporter gives back after a tenth of its delay: the script
 * runs this test with a delay of 10 minutes, so that nothing but the trim gives them back. */
#define BIG 10
#define BIG_SIZE (4 * MiB)

static int test_trim_large(void) {
    void *p[BIG];
    for (int i = 0; i < BIG; i++) {
        p[i] = malloc(BIG_SIZE);
        CHECK(p[i], "malloc %d", i);
        memset(p[i], i + 1, BIG_SIZE);
    }
    for (int i = 0; i < BIG; i++) free(p[i]);
    size_t before = rss();
    CHECK(malloc_trim(0) == 1, "malloc_trim said nothing was given back");
    size_t after = rss();
    CHECK(before > after + (BIG * BIG_SIZE) * 3 / 4, "resident %zu MiB before the trim, %zu after", before >> 20, after >> 20);
    /* Trimmed memory still serves requests, and reads zero for calloc. */
    unsigned char *q = calloc(1, BIG_SIZE);
    CHECK(q, "calloc");
    for (size_t i = 0; i < BIG_SIZE; i += 4096) CHECK(q[i] == 0, "calloc of trimmed memory reads %d at %zu", q[i], i);
    free(q);
    return 0;
}

/* Many small objects (fallow's with small objects on, glibc's otherwise), freed: either heap
 * gives them back. */
static int test_trim_small(void) {
    enum { N = 300000, SIZE = 96 };
    void **v = malloc(N * sizeof *v);
    CHECK(v, "malloc of the table");
    for (int i = 0; i < N; i++) {
        v[i] = malloc(SIZE);
        CHECK(v[i], "malloc %d", i);
        memset(v[i], 7, SIZE);
    }
    for (int i = 0; i < N; i++) free(v[i]);
    free(v);
    size_t before = rss();
    malloc_trim(0);
    size_t after = rss();
    CHECK(before > after + (size_t)N * SIZE / 2, "resident %zu MiB before the trim, %zu after", before >> 20, after >> 20);
    return 0;
}

static int test_mallinfo(void) {
    struct mallinfo2 m0 = mallinfo2();
    void *p[BIG];
    for (int i = 0; i < BIG; i++) {
        p[i] = malloc(BIG_SIZE);
        CHECK(p[i], "malloc %d", i);
        memset(p[i], 1, BIG_SIZE);
    }
    struct mallinfo2 m1 = mallinfo2();
    /* Deprecated in glibc, still called by programs. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo i1 = mallinfo();
#pragma GCC diagnostic pop
    CHECK(m1.uordblks >= m0.uordblks + BIG * BIG_SIZE, "in use %zu, was %zu", m1.uordblks, m0.uordblks);
    CHECK(m1.arena >= m1.uordblks, "arena %zu below in use %zu", m1.arena, m1.uordblks);
    CHECK((size_t)(unsigned)i1.uordblks == (m1.uordblks & 0xffffffffu), "mallinfo %d, mallinfo2 %zu", i1.uordblks, m1.uordblks);
    for (int i = 0; i < BIG; i++) free(p[i]);
    struct mallinfo2 m2 = mallinfo2();
    CHECK(m2.uordblks + BIG * BIG_SIZE <= m1.uordblks, "in use %zu after the frees, %zu before", m2.uordblks, m1.uordblks);
    return 0;
}

static int test_malloc_stats(void) {
    char path[] = "/tmp/fallow_stats_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    unlink(path);
    void *p = malloc(BIG_SIZE);
    CHECK(p, "malloc");
    memset(p, 1, BIG_SIZE);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    malloc_stats();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    free(p);
    char buf[16384];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    CHECK(n > 0, "nothing printed");
    buf[n] = 0;
    CHECK(strstr(buf, "Arena 0"), "glibc's part missing: %s", buf);
    CHECK(strstr(buf, "fallow: statistics"), "fallow's part missing: %s", buf);
    return 0;
}

int main(void) {
    static const struct { const char *name; int (*fn)(void); } tests[] = {
        { "malloc_trim of large blocks", test_trim_large },
        { "malloc_trim of small objects", test_trim_small },
        { "mallinfo2 and mallinfo", test_mallinfo },
        { "malloc_stats", test_malloc_stats },
    };
    int failures = 0;
    for (unsigned i = 0; i < sizeof tests / sizeof *tests; i++) {
        int r = tests[i].fn();
        printf("%s %s\n", r ? "FAIL" : "ok", tests[i].name);
        fflush(stdout);
        failures += r != 0;
    }
    return failures;
}

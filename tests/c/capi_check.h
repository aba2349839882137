/* What the C API's tests share: CHECK (on failure, say where and what, with the library's last
 * error, and return 1 from the test) and the runner (each test in order, "ok <name>" or
 * "FAIL <name>" per test, flushed before the next starts: a test may fork; the exit status is
 * the number of failures). */
#ifndef FALLOW_CAPI_CHECK_H
#define FALLOW_CAPI_CHECK_H

#include <fallow.h>
#include <stdio.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "  check failed at %s:%d: %s: ", __FILE__, __LINE__, #c); fprintf(stderr, __VA_ARGS__); fprintf(stderr, " [last error: %s]\n", fallow_last_error()); return 1; } } while (0)

struct capi_test { const char *name; int (*fn)(void); };

static int run_tests(const struct capi_test *tests, unsigned n) {
    int failures = 0;
    for (unsigned i = 0; i < n; i++) {
        int r = tests[i].fn();
        printf("%s %s\n", r ? "FAIL" : "ok", tests[i].name);
        fflush(stdout);
        failures += r != 0;
    }
    return failures;
}

#define RUN_TESTS(tests) run_tests(tests, sizeof tests / sizeof *tests)

#endif

/* The program `fallow run` is tested on (scripts/test-bench.sh): calloc, touch and free blocks
 * of 16 MiB for a while, keep 32 MiB live, then write its own figures (VmHWM and VmRSS from
 * /proc/self/status, getrusage(RUSAGE_SELF)) to the file argv[1], and end as argv[2] says: a
 * number is the exit status, "kill:N" raises signal N.
 *   probe OUT.txt STATUS [rounds] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static long status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    if (f)
        fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 100;
    int rounds = argc > 3 ? atoi(argv[3]) : 20;
    size_t block = 16u << 20;
    char *keep = calloc(1, 32u << 20);
    memset(keep, 1, 32u << 20);
    struct timespec pause = {0, 20 * 1000 * 1000};
    for (int i = 0; i < rounds; i++) {
        char *p = calloc(1, block);
        for (size_t k = 0; k < block; k += 4096)
            p[k] = (char)k;
        free(p);
        nanosleep(&pause, NULL);
    }
    /* Let the sampler (every 100 ms) see the memory settle. */
    struct timespec rest = {0, 300 * 1000 * 1000};
    nanosleep(&rest, NULL);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    FILE *out = fopen(argv[1], "w");
    if (!out)
        return 101;
    fprintf(out, "hwm_kib=%ld rss_kib=%ld maxrss_kib=%ld minflt=%ld majflt=%ld utime_us=%ld stime_us=%ld keep=%d\n",
            status_kib("VmHWM"), status_kib("VmRSS"), ru.ru_maxrss, ru.ru_minflt, ru.ru_majflt,
            ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec, ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec,
            keep[12345]);
    fclose(out);
    if (strncmp(argv[2], "kill:", 5) == 0)
        raise(atoi(argv[2] + 5));
    return atoi(argv[2]);
}

/* How long a process outlives its last thread when its first thread left by pthread_exit.
 *   last_thread_linger MS [touch]   run this program as the child (under the caller's
 *                                   environment, so LD_PRELOAD applies), print the time from
 *                                   its last thread's end to its reaping, in ms
 * The child frees 64 blocks of about 1 MiB (fallow's workers have work), sleeps 300 ms, starts a
 * thread that sleeps MS ms (with "touch", it allocates and frees a small object first: a thread
 * with a table of fallow's) and prints its end time, and leaves main by pthread_exit.
 * Build: cc -O2 -pthread -o last_thread_linger scripts/last_thread_linger.c */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static long late_ms;
static int touch;

static void *late(void *arg) {
    (void)arg;
    if (touch) {
        char *volatile q = malloc(100);
        q[0] = 1;
        free(q);
    }
    sleep_ms(late_ms);
    fprintf(stderr, "END %lld\n", now_ns());
    return NULL;
}

static int child(void) {
    char *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = malloc((1 << 20) + i * 4096);
        memset(p[i], 1, 1 << 20);
    }
    for (int i = 0; i < 64; i++) free(p[i]);
    sleep_ms(300);
    pthread_t t;
    pthread_create(&t, NULL, late, NULL);
    pthread_exit(NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s MS [touch]\n", argv[0]); return 2; }
    late_ms = atol(argv[1]);
    touch = argc > 2 && !strcmp(argv[2], "touch");
    if (getenv("LINGER_CHILD")) return child();
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        setenv("LINGER_CHILD", "1", 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fd[1]);
    char buf[256];
    ssize_t n = 0, r;
    while ((r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0) n += r;
    int status;
    waitpid(pid, &status, 0);
    long long reaped = now_ns();
    buf[n] = 0;
    char *end = strstr(buf, "END ");
    if (!end) { printf("no end line (status %#x): %s\n", status, buf); return 1; }
    printf("%.2f ms\n", (reaped - atoll(end + 4)) / 1e6);
    return 0;
}

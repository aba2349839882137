/* fallow's background threads never keep a process alive. A process ends when its last thread
 * does, and these programs end that way: their first thread leaves by pthread_exit (the C idiom
 * that lets the other threads run on), or a thread forks and the child's one thread returns
 * (Python's os.fork in a thread). Each first makes sure fallow's workers run (large blocks freed,
 * then a wait until the process has more threads than its own), so that the end is theirs to
 * allow; a run that never sees them fails rather than passing for nothing.
 *
 *   last_thread_test main_exits       the first thread leaves by pthread_exit while another
 *                                     thread still works; that thread's buffered output must
 *                                     appear (glibc's exit(0) from the last thread flushes it)
 *   last_thread_test fork_in_thread   a thread forks; the child starts a thread and its one
 *                                     thread returns; the parent waits for the child (8 s at
 *                                     most) and checks that it exited with 0
 *
 * Built without the C API for the preload library (scripts/test-capi.sh runs it under
 * LD_PRELOAD and `timeout`, small objects on and off), and with -DWITH_CAPI against libfallow,
 * where the blocks come from fallow_alloc. Exit status 0 when the case passed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "task_count.h"
#ifdef WITH_CAPI
#include <fallow.h>
static fallow_allocator *alloc_handle;
#endif

#define MiB (1024UL * 1024)

static void sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}


static void *block(size_t n) {
#ifdef WITH_CAPI
    void *p = NULL;
    return fallow_alloc(alloc_handle, n, 0, 0, &p) == 0 ? p : NULL;
#else
    return malloc(n);
#endif
}

static void unblock(void *p) {
#ifdef WITH_CAPI
    fallow_free(alloc_handle, p);
#else
    free(p);
#endif
}

/* Free enough large blocks that the workers have work, then wait (3 s at most) until the
 * process has more than `own` threads: fallow's workers. */
static int start_workers(int own) {
    void *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = block(MiB + (size_t)i * 4096);
        if (!p[i]) { fprintf(stderr, "FAIL: allocation %d\n", i); return 0; }
        memset(p[i], 1, MiB);
    }
    for (int i = 0; i < 64; i++) unblock(p[i]);
    for (int waited = 0; waited < 3000; waited += 10) {
        if (task_count() > own) return 1;
        sleep_ms(10);
    }
    fprintf(stderr, "FAIL: no worker thread started (threads: %d)\n", task_count());
    return 0;
}

static void *late_thread(void *arg) {
    (void)arg;
    sleep_ms(50);
    /* Buffered (stdout is a file or a pipe): only the process's exit() flushes it. */
    printf("thread done\n");
    return NULL;
}

static int main_exits(void) {
    if (!start_workers(1)) return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, late_thread, NULL)) { fprintf(stderr, "FAIL: pthread_create\n"); return 1; }
    pthread_exit(NULL);
}

static void *forking_thread(void *arg) {
    int *result = arg;
    pid_t pid = fork();
    if (pid < 0) { *result = 1; return NULL; }
    if (pid == 0) {
        /* The child: this thread is its only one, and its first. */
        if (!start_workers(1)) _exit(3);
        pthread_t t;
        if (pthread_create(&t, NULL, late_thread, NULL)) _exit(4);
        pthread_detach(t);
        return NULL; /* the child's first thread ends; the child must end after late_thread */
    }
    for (int waited = 0; waited < 8000; waited += 10) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            *result = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            if (*result) fprintf(stderr, "FAIL: child status %#x\n", status);
            return NULL;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "FAIL: the child is still alive 8 s after its last thread should have ended\n");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    *result = 1;
    return NULL;
}

static int fork_in_thread(void) {
    int result = 1;
    pthread_t t;
    if (pthread_create(&t, NULL, forking_thread, &result)) return 1;
    pthread_join(t, NULL);
    if (!result) printf("ok fork_in_thread\n");
    return result;
}

int main(int argc, char **argv) {
#ifdef WITH_CAPI
    if (fallow_create(NULL, &alloc_handle) != 0) { fprintf(stderr, "FAIL: fallow_create\n"); return 1; }
#endif
    if (argc == 2 && !strcmp(argv[1], "main_exits")) return main_exits();
    if (argc == 2 && !strcmp(argv[1], "fork_in_thread")) return fork_in_thread();
    fprintf(stderr, "usage: %s main_exits|fork_in_thread\n", argv[0]);
    return 2;
}

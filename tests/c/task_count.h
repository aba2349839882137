/* Threads of this process: the entries of /proc/self/task (the tests watch fallow's workers
 * appear). -1 when the directory cannot be read. */
#ifndef FALLOW_TASK_COUNT_H
#define FALLOW_TASK_COUNT_H
#include <dirent.h>

static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

#endif

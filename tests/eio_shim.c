/* An LD_PRELOAD shim that fails the writes and syncs of chosen files with EIO, for tests
 * of a disk that errs (tests/eio_shim.py builds and sets it up).
 *
 * libfiu's posix preload fails a call whatever the file it is made on; these tests need
 * EIO on one file (a stream's offsets) while every other file and socket of the broker
 * works. The shim wraps write, pwrite (pwrite64), fsync and fdatasync: when the file whose path is
 * in EIO_SHIM_SWITCH_WRITE (for writes) or EIO_SHIM_SWITCH_SYNC (for syncs) exists, a call
 * on a descriptor whose path contains EIO_SHIM_MATCH fails with EIO before doing anything.
 * The test turns the fault on and off by creating and removing the switch files.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define PATH_BYTES_MAX 4096

static int failing(int fd, const char *switch_variable) {
    const char *switch_path = getenv(switch_variable);
    const char *match = getenv("EIO_SHIM_MATCH");
    if (switch_path == NULL || match == NULL || access(switch_path, F_OK) != 0) {
        return 0;
    }
    char link[64];
    char path[PATH_BYTES_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, path, sizeof path - 1);
    if (length < 0) {
        return 0;
    }
    path[length] = '\0';
    return strstr(path, match) != NULL;
}

ssize_t write(int fd, const void *data, size_t size) {
    static ssize_t (*real)(int, const void *, size_t);
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    }
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_WRITE")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd, data, size);
}

static ssize_t failing_pwrite(const char *name, int fd, const void *data, size_t size,
                              off_t position) {
    ssize_t (*real)(int, const void *, size_t, off_t) =
        (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, name);
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_WRITE")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd, data, size, position);
}

ssize_t pwrite(int fd, const void *data, size_t size, off_t position) {
    return failing_pwrite("pwrite", fd, data, size, position);
}

ssize_t pwrite64(int fd, const void *data, size_t size, off_t position) {
    return failing_pwrite("pwrite64", fd, data, size, position);
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_SYNC")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_SYNC")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd);
}

/* An LD_PRELOAD shim that fails the I/O of chosen files, for tests of a disk that errs or
 * fills (tests/eio_shim.py builds and sets it up).
 *
 * libfiu's posix preload fails a call whatever the file it is made on; these tests need a
 * fault on one kind of file (a stream's offsets, a queue journal, a segment) while every
 * other file and socket of the broker works. The shim wraps write, pwrite (pwrite64),
 * fsync, fdatasync, read and pread (pread64). A call on a descriptor whose path contains
 * EIO_SHIM_MATCH is faulted while a switch file exists:
 *   EIO_SHIM_SWITCH_WRITE: writes fail with EIO_SHIM_ERRNO (a number; EIO when unset,
 *                          28 for ENOSPC) before writing anything;
 *   EIO_SHIM_SWITCH_SHORT: writes of more than one byte write only the first half and
 *                          return that count (a short write, as a filling disk gives);
 *   EIO_SHIM_SWITCH_SYNC:  fsync and fdatasync fail with EIO;
 *   EIO_SHIM_SWITCH_READ:  read and pread fail with EIO.
 * The test turns each fault on and off by creating and removing the switch files.
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

static int write_errno(void) {
    const char *number = getenv("EIO_SHIM_ERRNO");
    return number == NULL ? EIO : atoi(number);
}

/* The size a write may write: 0 when it must fail (errno set), half when short. */
static size_t write_allowance(int fd, size_t size, int *fail) {
    int saved = errno;
    *fail = 0;
    if (failing(fd, "EIO_SHIM_SWITCH_WRITE")) {
        *fail = 1;
        errno = write_errno();
        return 0;
    }
    if (size > 1 && failing(fd, "EIO_SHIM_SWITCH_SHORT")) {
        size /= 2;
    }
    errno = saved;
    return size;
}

ssize_t write(int fd, const void *data, size_t size) {
    static ssize_t (*real)(int, const void *, size_t);
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    }
    int fail;
    size_t allowed = write_allowance(fd, size, &fail);
    return fail ? -1 : real(fd, data, allowed);
}

static ssize_t faulted_pwrite(const char *name, int fd, const void *data, size_t size,
                              off_t position) {
    ssize_t (*real)(int, const void *, size_t, off_t) =
        (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, name);
    int fail;
    size_t allowed = write_allowance(fd, size, &fail);
    return fail ? -1 : real(fd, data, allowed, position);
}

ssize_t pwrite(int fd, const void *data, size_t size, off_t position) {
    return faulted_pwrite("pwrite", fd, data, size, position);
}

ssize_t pwrite64(int fd, const void *data, size_t size, off_t position) {
    return faulted_pwrite("pwrite64", fd, data, size, position);
}

static int faulted_sync(const char *name, int fd) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_SYNC")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd);
}

int fsync(int fd) { return faulted_sync("fsync", fd); }

int fdatasync(int fd) { return faulted_sync("fdatasync", fd); }

ssize_t read(int fd, void *data, size_t size) {
    static ssize_t (*real)(int, void *, size_t);
    if (real == NULL) {
        real = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    }
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_READ")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd, data, size);
}

static ssize_t faulted_pread(const char *name, int fd, void *data, size_t size,
                             off_t position) {
    ssize_t (*real)(int, void *, size_t, off_t) =
        (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, name);
    int saved = errno;
    if (failing(fd, "EIO_SHIM_SWITCH_READ")) {
        errno = EIO;
        return -1;
    }
    errno = saved;
    return real(fd, data, size, position);
}

ssize_t pread(int fd, void *data, size_t size, off_t position) {
    return faulted_pread("pread", fd, data, size, position);
}

ssize_t pread64(int fd, void *data, size_t size, off_t position) {
    return faulted_pread("pread64", fd, data, size, position);
}

/*
 * common/sp.h — what every sptrace component shares: the error type that
 * carries a message naming the object that failed, small string helpers,
 * whole-buffer I/O, time and SHA-256.  Kept libc-only so the agent can use it too.
 */
#ifndef SP_H
#define SP_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/*
 * An error message filled by the function that failed.  Libraries never print
 * and never exit; they return a negative status and describe the failure here,
 * naming the file, pid, host or offset and, where one exists, what to do.
 */
typedef struct sp_err {
	char msg[1024];
} sp_err;

/* Set the message (printf style); returns -1 so callers can `return sp_fail()`. */
int sp_fail(sp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix an existing message with more context ("reading X: <old message>"). */
int sp_failctx(sp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t sp_now_ns(void);

/* Growable array helper: ensure room for `need` elements of `elsize` bytes. */
int sp_grow(void **arr, size_t *cap, size_t need, size_t elsize);

/*
 * Write or read all n bytes, retrying on EINTR and short counts; 0, or -1
 * with errno set (EIO when the file ends or takes no more bytes).
 */
int sp_write_all(int fd, const void *buf, size_t n);
int sp_read_all(int fd, void *buf, size_t n);

/*
 * Open `path` for reading only if it is a regular file (io.c): a FIFO, a
 * device (/dev/urandom, /dev/zero) or a directory would block the reader or
 * never end.  O_NONBLOCK makes the open of a FIFO return at once (its fstat
 * then refuses it); with `nofollow`, a symbolic link is refused too (O_NOFOLLOW).
 * The fd, or -1 with errno: ENOENT and the like from open, ELOOP for a link,
 * EFTYPE_SP for anything not a regular file.  sp_open_why() words errno.
 */
#define EFTYPE_SP EMEDIUMTYPE
int sp_open_regular(const char *path, int nofollow);
const char *sp_open_why(int e);

/* SHA-256 (sha256.c). */
typedef struct sp_sha256 {
	uint32_t h[8];
	uint64_t len;            /* bytes so far */
	uint8_t buf[64];
	size_t fill;             /* bytes in buf */
} sp_sha256;
void sp_sha256_init(sp_sha256 *s);
void sp_sha256_update(sp_sha256 *s, const void *data, size_t n);
void sp_sha256_final(sp_sha256 *s, uint8_t out[32]);

#endif

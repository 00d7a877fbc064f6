/* common/io.c — whole-buffer reads and writes declared in sp.h. */
#include "sp.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sp_write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;

	while (n) {
		ssize_t k = write(fd, p, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		if (k == 0) {
			errno = EIO;
			return -1;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int sp_read_all(int fd, void *buf, size_t n)
{
	char *p = buf;

	while (n) {
		ssize_t k = read(fd, p, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		if (k == 0) {
			errno = EIO;   /* end of file before n bytes */
			return -1;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int sp_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;   /* the file ends before n bytes */
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

int sp_fd_private(int fd, struct stat *st)
{
	if (fstat(fd, st) != 0) {
		memset(st, 0, sizeof *st);
		return 0;
	}
	return st->st_uid == geteuid() && !(st->st_mode & 022);
}

int sp_open_regular(const char *path, int nofollow)
{
	struct stat st = { 0 };
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		int e = S_ISREG(st.st_mode) ? errno : EFTYPE_SP;

		close(fd);
		errno = e;
		return -1;
	}
	/* Back to blocking reads: O_NONBLOCK was for the open of a FIFO only. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

const char *sp_open_why(int e)
{
	if (e == EFTYPE_SP)
		return "not a regular file (a FIFO, a device or a directory is refused: "
		       "reading it could block or never end)";
	if (e == ELOOP)
		return "a symbolic link, refused here (copy the files themselves, e.g. cp -rL)";
	return strerror(e);
}

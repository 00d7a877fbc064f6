/* common/io.c — whole-buffer reads and writes declared in sp.h. */
#include "sp.h"

#include <errno.h>
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

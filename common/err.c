/* common/err.c — error messages and small helpers declared in sp.h. */
#include "sp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int sp_fail(sp_err *err, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return -1;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	va_end(ap);
	return -1;
}

int sp_failctx(sp_err *err, const char *fmt, ...)
{
	char prefix[512], old[sizeof err->msg];
	va_list ap;

	if (!err)
		return -1;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof old);
	/* Truncation is fine here: the start of the message matters most. */
	size_t n = strlen(prefix);
	if (n > sizeof err->msg - 3)
		n = sizeof err->msg - 3;
	memcpy(err->msg, prefix, n);
	memcpy(err->msg + n, ": ", 2);
	n += 2;
	size_t rest = strnlen(old, sizeof old - 1);
	if (rest > sizeof err->msg - 1 - n)
		rest = sizeof err->msg - 1 - n;
	memcpy(err->msg + n, old, rest);
	err->msg[n + rest] = '\0';
	return -1;
}

uint64_t sp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int sp_grow(void **arr, size_t *cap, size_t need, size_t elsize)
{
	size_t ncap;
	void *p;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap : 16;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, ncap * elsize);
	if (!p)
		return -1;
	*arr = p;
	*cap = ncap;
	return 0;
}

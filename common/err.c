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

static uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

static uint64_t tsc0, mono0, tsc_hz;

void sp_clock_pair(uint64_t *tsc, uint64_t *mono)
{
	uint64_t best = UINT64_MAX;

	*tsc = *mono = 0;
	for (int i = 0; i < 5; i++) {
		uint64_t a = rdtsc(), m = sp_now_ns(), b = rdtsc();

		if (b - a < best) {
			best = b - a;
			*tsc = a + (b - a) / 2;
			*mono = m;
		}
	}
}

void sp_tsc_hz_start(void)
{
	if (!mono0) {
		sp_now_ns();            /* the vDSO's data in */
		sp_clock_pair(&tsc0, &mono0);
	}
}

uint64_t sp_tsc_hz_since(uint64_t t0, uint64_t m0)
{
	uint64_t t1, m1;

	do {
		sp_clock_pair(&t1, &m1);
	} while (m1 - m0 < 2000000);
	return (uint64_t)((double)(t1 - t0) * 1e9 / (double)(m1 - m0));
}

uint64_t sp_tsc_hz(void)
{
	if (!tsc_hz) {
		sp_tsc_hz_start();
		tsc_hz = sp_tsc_hz_since(tsc0, mono0);
	}
	return tsc_hz;
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

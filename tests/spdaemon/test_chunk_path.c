/*
 * test_chunk_path.c — spd_chunk_path_ok (spdaemon/frame.c): which paths of
 * a CollectChunk `sptrace collect` writes below OUT/HOST, and which it
 * refuses (a hostile daemon's way out of OUT, or onto the collector's own
 * .part files).
 */
#include <stdio.h>
#include <string.h>

#include "spd.h"

int main(void)
{
	static const char *const good[] = {
		"1234/meta", "1234/ring.1234", "1234/exec.1234.1/meta", "a", "1234/.hidden",
		"1234/x.partial", "1234/part", "1234/...",
	};
	static const char *const bad[] = {
		"", "/etc/passwd", "../x", "1234/../../x", "1234/..", "..", ".", "1234/./meta",
		"1234//meta", "1234/", "1234/meta.part", "x.part", "1234/a\nb", "1234/\x7f",
		"1234/\x01", NULL,
	};
	char long_name[300], long_path[SPD_CHUNK_PATH_MAX + 10];
	int failures = 0;

	for (size_t i = 0; i < sizeof good / sizeof *good; i++)
		if (!spd_chunk_path_ok(good[i])) {
			fprintf(stderr, "FAIL: '%s' refused\n", good[i]);
			failures++;
		}
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		if (spd_chunk_path_ok(bad[i])) {
			fprintf(stderr, "FAIL: '%s' accepted\n", bad[i] ? bad[i] : "(null)");
			failures++;
		}
	memset(long_name, 'a', 251);
	long_name[251] = '\0';
	if (spd_chunk_path_ok(long_name)) {
		fprintf(stderr, "FAIL: a component of 251 bytes (no room for .part) accepted\n");
		failures++;
	}
	long_name[250] = '\0';
	if (!spd_chunk_path_ok(long_name)) {
		fprintf(stderr, "FAIL: a component of 250 bytes refused\n");
		failures++;
	}
	for (size_t i = 0; i + 2 < sizeof long_path; i += 2)
		memcpy(long_path + i, "a/", 2);
	long_path[sizeof long_path - 2] = 'a';
	long_path[sizeof long_path - 1] = '\0';
	if (spd_chunk_path_ok(long_path)) {
		fprintf(stderr, "FAIL: a path of %zu bytes accepted\n", strlen(long_path));
		failures++;
	}
	if (!failures)
		printf("ok\n");
	return failures != 0;
}

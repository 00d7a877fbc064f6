/*
 * tp_libs.c — a program that uses the libraries the agent uses too (issue
 * 11, item 7): zlib, liblzma and libelf, each called after the handshake.
 * The agent once loaded them for itself and left the program's calls into
 * them untraced; now it shares none of them, and test_transparency.py
 * checks that the replay holds deflate, inflate, lzma_easy_buffer_encode
 * and elf_begin.
 *
 * It also defines capstone's cs_open, exported (-rdynamic) as a plugin host
 * exports its symbols, and counts who calls it: an agent whose own capstone
 * calls bound to the program's (a shared libcapstone, or a copy whose
 * symbols the agent exports) would call it while it analyses the library
 * the program dlopen's (libtp_sigwait_dl.so, in no repository), and the
 * count would differ from the native run's.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <libelf.h>
#include <limits.h>
#include <lzma.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "tp.h"

/* capstone's cs_open(cs_arch, cs_mode, csh *), as the program's own. */
static unsigned cs_open_calls;

int cs_open(int arch, int mode, size_t *handle)
{
	(void)arch;
	(void)mode;
	(void)handle;
	cs_open_calls++;
	return 1;                       /* CS_ERR_MEM: no handle */
}

static unsigned char input[64 * 1024], packed[80 * 1024], unpacked[64 * 1024];

int tp_setup(const char *scratch)
{
	(void)scratch;
	for (size_t i = 0; i < sizeof input; i++)
		input[i] = (unsigned char)("sptrace traces libz\n"[i % 20] + (i / 4096));
	return 0;
}

static TP_NOINLINE int with_zlib(void)
{
	z_stream z;
	size_t packed_len;

	memset(&z, 0, sizeof z);
	if (deflateInit(&z, 6) != Z_OK)
		return -1;
	z.next_in = input;
	z.avail_in = sizeof input;
	z.next_out = packed;
	z.avail_out = sizeof packed;
	if (deflate(&z, Z_FINISH) != Z_STREAM_END)
		return -1;
	packed_len = z.total_out;
	deflateEnd(&z);
	memset(&z, 0, sizeof z);
	if (inflateInit(&z) != Z_OK)
		return -1;
	z.next_in = packed;
	z.avail_in = (unsigned)packed_len;
	z.next_out = unpacked;
	z.avail_out = sizeof unpacked;
	if (inflate(&z, Z_FINISH) != Z_STREAM_END)
		return -1;
	inflateEnd(&z);
	printf("zlib: %zu bytes -> %zu -> %lu, %s, crc %08lx\n", sizeof input, packed_len,
	       z.total_out, memcmp(input, unpacked, sizeof input) ? "different" : "same",
	       crc32(0, unpacked, sizeof unpacked));
	return 0;
}

static TP_NOINLINE int with_lzma(void)
{
	size_t out = 0, in = 0, got = 0;
	uint64_t limit = UINT64_MAX;

	if (lzma_easy_buffer_encode(1, LZMA_CHECK_CRC32, NULL, input, sizeof input, packed, &out,
				    sizeof packed) != LZMA_OK)
		return -1;
	if (lzma_stream_buffer_decode(&limit, 0, NULL, packed, &in, out, unpacked, &got,
				      sizeof unpacked) != LZMA_OK)
		return -1;
	printf("lzma: %zu bytes -> %zu -> %zu, %s\n", sizeof input, out, got,
	       memcmp(input, unpacked, sizeof input) ? "different" : "same");
	return 0;
}

static TP_NOINLINE int with_libelf(void)
{
	int fd = open("/proc/self/exe", O_RDONLY);
	Elf *e;
	size_t nsecs = 0;

	if (fd < 0 || elf_version(EV_CURRENT) == EV_NONE)
		return -1;
	e = elf_begin(fd, ELF_C_READ, NULL);
	if (!e || elf_getshdrnum(e, &nsecs) != 0)
		return -1;
	printf("libelf: kind %d, %s sections\n", (int)elf_kind(e), nsecs > 10 ? "many" : "few");
	elf_end(e);
	close(fd);
	return 0;
}


int tp_after_go(const char *scratch)
{
	struct timespec pause = { 1, 500000000 };
	size_t handle = 0;
	unsigned (*work)(unsigned);
	void *lib;

	(void)scratch;
	if (with_zlib() || with_lzma() || with_libelf()) {
		printf("a library call failed\n");
		return 1;
	}
	cs_open(3, 0, &handle);          /* the program's own call: one */
	lib = tp_open_library();
	work = lib ? (unsigned (*)(unsigned))dlsym(lib, "tpdl_work") : NULL;
	if (!work) {
		printf("dlopen: %s\n", dlerror());
		return 1;
	}
	printf("library result %u\n", work(1000));
	fflush(stdout);
	/* Time for the agent to find the library and analyse it. */
	nanosleep(&pause, NULL);
	printf("library result again %u\n", work(2000));
	printf("cs_open called %u time(s)\n", cs_open_calls);
	return 0;
}

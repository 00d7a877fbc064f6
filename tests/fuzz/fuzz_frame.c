/*
 * tests/fuzz/fuzz_frame.c — libFuzzer target for the spdaemon protocol's
 * reader (spdaemon/frame.c), what a hostile peer reaches first.
 *
 * An input is the byte stream a connection delivers: it is put in a memory
 * file and read frame by frame with spd_frame_read, as the daemon reads a
 * connection, until the stream ends or a frame is refused; each accepted
 * frame is written back out (the writer must take whatever the reader
 * accepted), and a CollectChunk's path goes through spd_chunk_path_ok as
 * `sptrace collect` checks it.  The whole input is also given to spd_frame_decode as one
 * payload.  Everything is freed per input, so the leak check sees leaks.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "spd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int null_fd = -1;
	Sptrace__Spd__Frame *f;
	spd_conn in = { .fd = memfd_create("fuzz-frame", MFD_CLOEXEC), .peer = "fuzz" };
	spd_conn out = { .peer = "null" };
	sp_err err;

	if (null_fd < 0)
		null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	out.fd = null_fd;
	if (in.fd < 0 || sp_write_all(in.fd, data, size) != 0 || lseek(in.fd, 0, SEEK_SET) != 0)
		abort();
	while (spd_frame_read(&in, &f, &err) == 1) {
		if (spd_frame_write(&out, f, &err) != 0)
			abort();
		/* what `sptrace collect` checks of each chunk it receives */
		if (f->body_case == SPTRACE__SPD__FRAME__BODY_COLLECT_CHUNK)
			(void)spd_chunk_path_ok(f->collect_chunk->path);
		spd_frame_free(f);
	}
	close(in.fd);
	if ((f = spd_frame_decode(data, size, "fuzz", &err)))
		spd_frame_free(f);
	return 0;
}

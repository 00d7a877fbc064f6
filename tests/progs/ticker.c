/*
 * ticker.c — an interactive program's stand-in for `--on key`
 * (tests/e2e/test_hotkey.py): prints "ready", then calls tick() every 10 ms
 * until its standard input closes, and prints how many ticks it made.
 */
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

#define KEEP __attribute__((noinline, noipa))

static volatile long ticks;

static KEEP void tick(void)
{
	ticks++;
}

int main(void)
{
	struct pollfd p = { 0, POLLIN, 0 };
	char buf[64];

	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int r = poll(&p, 1, 10);

		if (r > 0 && read(0, buf, sizeof buf) <= 0)
			break;
		if (r == 0)
			tick();
	}
	printf("ticks %ld\n", ticks);
	return 0;
}

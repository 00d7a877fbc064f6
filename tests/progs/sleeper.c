/* sleeper.c — waits until standard input closes (tests/e2e/test_attach.py:
 * the error cases; built dynamic and -static). */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	char buf[64];

	printf("ready\n");
	fflush(stdout);
	while (read(0, buf, sizeof buf) > 0)
		;
	return 0;
}

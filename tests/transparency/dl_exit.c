/*
 * dl_exit.c — dlopen's libtp_sigwait_dl.so (beside it), calls into it and
 * exits at once: the agent has no time to analyse the library, whose
 * analysis must still be in the repository after `sptrace run` returns
 * (test_analyses.py early-exit).
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
	unsigned (*work)(unsigned);
	char *slash;
	void *lib;

	if (n <= 0)
		return 2;
	path[n] = '\0';
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "libtp_sigwait_dl.so");
	lib = dlopen(path, RTLD_NOW);
	if (!lib || !(work = (unsigned (*)(unsigned))dlsym(lib, "tpdl_work"))) {
		printf("dlopen: %s\n", dlerror());
		return 1;
	}
	printf("library result %u\n", work(10));
	return 0;
}

/*
 * rawwait.c — a process whose every thread waits in a system call made
 * from its own code (an inline syscall instruction), not from the C
 * library's: sptrace attach must not load there, and must say which threads
 * wait in which call from which module (tests/e2e/test_attach.py).
 */
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>

static int word;

/* futex(&word, FUTEX_WAIT, 0): word never changes, the wait never ends. */
static void raw_wait(void)
{
	for (;;) {
		register long timeout __asm__("r10") = 0;
		long rc;

		__asm__ volatile("syscall"
				 : "=a"(rc)
				 : "0"((long)SYS_futex), "D"(&word), "S"(0L), "d"(0L), "r"(timeout)
				 : "rcx", "r11", "memory");
		(void)rc;
	}
}

static void *waiter(void *arg)
{
	(void)arg;
	raw_wait();
	return NULL;
}

int main(void)
{
	pthread_t th;

	if (pthread_create(&th, NULL, waiter, NULL) != 0)
		return 1;
	printf("ready\n");
	fflush(stdout);
	raw_wait();
	return 0;
}

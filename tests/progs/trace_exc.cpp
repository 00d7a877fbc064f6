// trace_exc.cpp — a C++ exception thrown through five traced frames, with a
// destructor in each, caught at the top.  Output and exit status must be the
// same with and without tracing.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <time.h>

#define KEEP __attribute__((noinline, noclone))

struct Guard {
	const char *name;
	~Guard() { std::printf("~%s\n", name); }
};

KEEP void f5(int x) { Guard g{"f5"}; if (x > 0) throw std::runtime_error("deep " + std::to_string(x)); }
KEEP void f4(int x) { Guard g{"f4"}; f5(x); }
KEEP void f3(int x) { Guard g{"f3"}; f4(x); }
KEEP void f2(int x) { Guard g{"f2"}; f3(x); }
KEEP void f1(int x) { Guard g{"f1"}; f2(x); }

KEEP int catcher(int x)
{
	try {
		f1(x);
	} catch (const std::exception &e) {
		std::printf("caught: %s\n", e.what());
		return 4;
	}
	return 0;
}

// "midrun": tracing begins (--on 'timer 0.3') while s3 sleeps under s2, s1
// and catcher_slow; then s3 throws.  The exception unwinds through frames
// whose return addresses are the agent's return stubs, destructors run, and
// catcher_slow catches it.
KEEP void s3(int x)
{
	Guard g{"s3"};
	struct timespec d = { 0, 600000000 };

	nanosleep(&d, nullptr);
	if (x > 0)
		throw std::runtime_error("late " + std::to_string(x));
}
KEEP void s2(int x) { Guard g{"s2"}; s3(x); }
KEEP void s1(int x) { Guard g{"s1"}; s2(x); }

KEEP int catcher_slow(int x)
{
	try {
		s1(x);
	} catch (const std::exception &e) {
		std::printf("caught: %s\n", e.what());
		return catcher(x) + 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && std::string(argv[1]) == "midrun")
		return catcher_slow(1);
	return catcher(argc) + catcher(argc - 1);
}
